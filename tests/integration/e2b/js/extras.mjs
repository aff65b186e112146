// The E2B client class with its options bound (no E2B_* variables), list
// filters and order, gzip, Blob and stream bodies, signed URLs, a command's
// timeout and getMetrics. argv[2]: the deployment's name, a template too.
import { setTimeout as sleep } from 'node:timers/promises'
import { E2B } from 'e2b'
import { failure, main } from './common.mjs'

const { E2B_API_URL: apiUrl, E2B_SANDBOX_URL: sandboxUrl, E2B_API_KEY: apiKey } = process.env
for (const name of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) delete process.env[name]

async function text(stream) {
  let out = ''
  for await (const chunk of stream) out += new TextDecoder().decode(chunk)
  return out
}

main(async () => {
  const { Sandbox } = new E2B({ apiKey, apiUrl, sandboxUrl })
  const metadata = { suite: `extras-${process.pid}` }
  const first = await Sandbox.create('base', { metadata })
  const second = await Sandbox.create(process.argv[2], { metadata })
  const seen = { ids: [first.sandboxId, second.sandboxId] }
  try {
    const listed = async (opts) =>
      (await Sandbox.list({ ...opts, query: { metadata, ...opts?.query } }).nextItems()).map((s) => s.sandboxId)
    seen.list = {
      default: await listed(),
      asc: await listed({ order: 'asc' }),
      base: await listed({ query: { template: 'base' } }),
      own: await listed({ query: { template: process.argv[2] } }),
      startedAfter: await listed({ query: { startedAfter: (await second.getInfo()).startedAt } }),
    }

    const sandbox = first
    const repeated = 'podbay '.repeat(10_000)
    await sandbox.files.write('/tmp/g.txt', repeated, { gzip: true })
    seen.gzip = (await sandbox.files.read('/tmp/g.txt', { gzip: true })) === repeated
    await sandbox.files.write('/tmp/blob.txt', new Blob(['from a blob']))
    await sandbox.files.write('/tmp/stream.txt', new Blob(['from a stream']).stream())
    seen.bodies = [
      await (await sandbox.files.read('/tmp/blob.txt', { format: 'blob' })).text(),
      await text(await sandbox.files.read('/tmp/stream.txt', { format: 'stream' })),
    ]

    const upload = new FormData()
    upload.append('file', new Blob(['uploaded by url']), 'ignored-name.txt')
    const uploadUrl = await sandbox.uploadUrl('/tmp/up.txt')
    seen.upload = (await fetch(uploadUrl, { method: 'POST', body: upload })).status
    seen.uploaded = await sandbox.files.read('/tmp/up.txt')
    const downloadUrl = await sandbox.downloadUrl('/tmp/up.txt', { useSignatureExpiration: 60 })
    const downloaded = await fetch(downloadUrl)
    seen.download = { status: downloaded.status, body: await downloaded.text() }
    const tampered = new URL(downloadUrl)
    tampered.searchParams.set('path', '/tmp/g.txt')
    seen.tampered = (await fetch(tampered)).status

    seen.commandTimeout = await failure(sandbox.commands.run('sleep 600', { timeoutMs: 1000 }))

    let metrics = await sandbox.getMetrics()
    while (metrics.length === 0) {  // the server samples every 2 s; pytest's timeout bounds this
      await sleep(200)
      metrics = await sandbox.getMetrics()
    }
    const sample = metrics.at(-1)
    seen.metrics = {
      timestamp: sample.timestamp instanceof Date,
      cpuCount: sample.cpuCount > 0,
      memTotal: sample.memTotal > 0,
      diskTotal: sample.diskTotal > 0,
    }
  } finally {
    await first.kill()
    await second.kill()
  }
  return seen
})
