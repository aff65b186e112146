// Refusals in the SDK's error classes: a wrong key, an unknown template.
import { Sandbox } from 'e2b'
import { failure, main } from './common.mjs'

main(async () => ({
  wrongKey: await failure(Sandbox.create('base', { apiKey: `e2b_${'0'.repeat(40)}` })),
  unknownTemplate: await failure(Sandbox.create('no-such-template')),
  listWrongKey: await failure(Sandbox.list({ apiKey: `e2b_${'0'.repeat(40)}` }).nextItems()),
}))
