// pty: create with size, cwd and envs; sendInput; resize; connect; exit; kill.
import { Sandbox } from 'e2b'
import { Collected, failure, main } from './common.mjs'

const input = (text) => new TextEncoder().encode(text)

main(async () => {
  const sandbox = await Sandbox.create('base')
  const seen = {}
  try {
    const screen = new Collected()
    const terminal = await sandbox.pty.create({
      cols: 80,
      rows: 24,
      cwd: '/tmp',
      envs: { MARK: 'pty' },
      onData: screen.add,
    })
    seen.listed = (await sandbox.commands.list()).some((p) => p.pid === terminal.pid)
    // The shell computes the marker: its echo of the input does not contain it.
    await sandbox.pty.sendInput(terminal.pid, input('echo $MARK-$((6*7)) $(pwd) $(stty size)\n'))
    seen.line = (await screen.until('pty-42 /tmp 24 80')).includes('pty-42 /tmp 24 80')
    await sandbox.pty.resize(terminal.pid, { cols: 100, rows: 30 })
    const second = new Collected()
    const follower = await sandbox.pty.connect(terminal.pid, { onData: second.add })
    await sandbox.pty.sendInput(terminal.pid, input('echo size-$(stty size | tr " " x)\n'))
    seen.resized = (await second.until('size-30x100')).includes('size-30x100')
    await sandbox.pty.sendInput(terminal.pid, input('exit 3\n'))
    seen.exit = await failure(terminal.wait())
    seen.followerExit = await failure(follower.wait())

    const killed = await sandbox.pty.create({ cols: 80, rows: 24, user: 'root', onData: () => {} })
    seen.kill = await sandbox.pty.kill(killed.pid)
    seen.killedWait = await failure(killed.wait())
  } finally {
    await sandbox.kill()
  }
  return seen
})
