// Sandbox.create with a template, metadata and a timeout; getInfo, setTimeout,
// getHost, Sandbox.list, pause and connect (resume), kill; calls on a killed
// sandbox answer in the SDK's error classes.
import http from 'node:http'
import { Sandbox } from 'e2b'
import { failure, main } from './common.mjs'

/** GET through podbay's Host routing (what a resolver for *.localhost does). */
function throughHost(host, token) {
  const server = new URL(process.env.E2B_API_URL)
  const headers = { Host: host }
  if (token) headers['E2B-Traffic-Access-Token'] = token
  return new Promise((resolve, reject) => {
    const request = http.get(
      { hostname: server.hostname, port: server.port, path: '/hello.txt', headers },
      (answer) => {
        let body = ''
        answer.on('data', (chunk) => (body += chunk))
        answer.on('end', () => resolve({ status: answer.statusCode, body }))
      },
    )
    request.on('error', reject)
  })
}

main(async () => {
  const marker = `js-${process.pid}`
  const sandbox = await Sandbox.create('base', { metadata: { suite: marker }, timeoutMs: 120_000 })
  const seen = { sandboxId: sandbox.sandboxId }
  try {
    const info = await sandbox.getInfo()
    seen.info = { templateId: info.templateId, metadata: info.metadata, state: info.state }
    seen.initialSeconds = (info.endAt - info.startedAt) / 1000
    await sandbox.setTimeout(600_000)
    seen.extendedSeconds = ((await sandbox.getInfo()).endAt - info.startedAt) / 1000

    const listed = await Sandbox.list({ query: { metadata: { suite: marker } } }).nextItems()
    seen.listed = listed.map((s) => s.sandboxId)
    seen.listedOther = (await Sandbox.list({ query: { metadata: { suite: 'nobody' } } }).nextItems()).length

    await sandbox.files.write('/tmp/hello.txt', 'served\n')
    await sandbox.commands.run('cd /tmp && exec python3 -m http.server 8080 --bind 127.0.0.1', {
      background: true,
      timeoutMs: 0,
    })
    const host = sandbox.getHost(8080)
    seen.host = host
    let served
    do {  // until the server in the sandbox listens; pytest's timeout bounds this
      served = await throughHost(host, sandbox.trafficAccessToken)
    } while (served.status === 502)
    seen.served = served
    seen.servedWithoutToken = (await throughHost(host, null)).status

    seen.pause = await sandbox.pause()
    seen.runningWhilePaused = await sandbox.isRunning()
    seen.listedPaused = (await Sandbox.list({ query: { metadata: { suite: marker }, state: ['paused'] } }).nextItems())
      .map((s) => [s.sandboxId, s.state])
    const resumed = await Sandbox.connect(sandbox.sandboxId)
    seen.resumedRunning = await resumed.isRunning()
    seen.afterResume = (await resumed.commands.run('cat /tmp/hello.txt')).stdout
  } finally {
    seen.kill = await sandbox.kill()
  }
  seen.runningAfterKill = await sandbox.isRunning()
  seen.killAgain = await Sandbox.kill(sandbox.sandboxId)
  seen.runAfterKill = await failure(sandbox.commands.run('true'))
  seen.connectAfterKill = await failure(Sandbox.connect(sandbox.sandboxId))
  seen.infoAfterKill = await failure(sandbox.getInfo())
  return seen
})
