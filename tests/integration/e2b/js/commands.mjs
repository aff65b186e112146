// commands.run: output, exit codes, envs, cwd, user, callbacks; background
// commands: list, stdin, connect, kill.
import { Sandbox } from 'e2b'
import { Collected, failure, main } from './common.mjs'

main(async () => {
  const sandbox = await Sandbox.create('base', { envs: { GREETING: 'hello' } })
  const seen = {}
  try {
    const ran = await sandbox.commands.run('echo out; echo err >&2')
    seen.run = { stdout: ran.stdout, stderr: ran.stderr, exitCode: ran.exitCode }
    seen.envs = (await sandbox.commands.run('echo $GREETING-$X', { envs: { X: 'y' } })).stdout
    seen.home = (await sandbox.commands.run('pwd; id -un')).stdout
    seen.cwdRoot = (await sandbox.commands.run('pwd; id -un', { cwd: '/tmp', user: 'root' })).stdout
    const streamed = []
    const withCallbacks = await sandbox.commands.run('echo a; echo b >&2', {
      onStdout: (d) => streamed.push(['out', d]),
      onStderr: (d) => streamed.push(['err', d]),
    })
    seen.callbacks = { streamed, stdout: withCallbacks.stdout }
    seen.exit3 = await failure(sandbox.commands.run('echo oops >&2; exit 3'))

    // A background command: listed, then killed; its wait() tells it ended by a signal.
    const sleeper = await sandbox.commands.run('sleep 600', { background: true })
    seen.listed = (await sandbox.commands.list()).some((p) => p.pid === sleeper.pid)
    seen.killed = await sleeper.kill()
    seen.killedWait = await failure(sleeper.wait())
    seen.listedAfterKill = (await sandbox.commands.list()).some((p) => p.pid === sleeper.pid)
    seen.killAgain = await sandbox.commands.kill(sleeper.pid)

    // stdin, and a second follower through connect.
    const output = new Collected()
    const cat = await sandbox.commands.run('cat', { background: true, stdin: true, onStdout: output.add })
    await sandbox.commands.sendStdin(cat.pid, 'typed\n')
    await output.until('typed\n')
    const second = new Collected()
    const follower = await sandbox.commands.connect(cat.pid, { onStdout: second.add })
    await sandbox.commands.sendStdin(cat.pid, 'again\n')
    await second.until('again\n')
    seen.supportsStdinClose = sandbox.commands.supportsStdinClose
    if (sandbox.commands.supportsStdinClose) {
      await sandbox.commands.closeStdin(cat.pid)
    } else {
      await sandbox.commands.kill(cat.pid)
    }
    const ended = await failure(cat.wait())
    seen.cat = { stdout: cat.stdout, ended, followerWait: await failure(follower.wait()) }
  } finally {
    await sandbox.kill()
  }
  return seen
})
