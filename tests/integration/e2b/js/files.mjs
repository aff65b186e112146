// files: write (text, bytes, several), read (text, bytes), list, makeDir,
// exists, getInfo, rename, remove, watchDir; a missing file's error class.
import { FileType, Sandbox } from 'e2b'
import { failure, main, signal } from './common.mjs'

main(async () => {
  const sandbox = await Sandbox.create('base')
  const seen = {}
  try {
    const written = await sandbox.files.write('/tmp/js/a.txt', 'written by js\n')
    seen.written = { path: written.path, name: written.name }
    seen.readText = await sandbox.files.read('/tmp/js/a.txt')
    seen.catText = (await sandbox.commands.run('cat /tmp/js/a.txt')).stdout
    await sandbox.files.write('/tmp/js/b.bin', new Uint8Array([0, 255, 98, 121, 116, 101, 115]).buffer)
    seen.readBytes = Array.from(await sandbox.files.read('/tmp/js/b.bin', { format: 'bytes' }))
    seen.relative = (await sandbox.files.write('rel.txt', 'home')).path
    const several = await sandbox.files.write([
      { path: '/tmp/js/many/1.txt', data: 'one' },
      { path: '/tmp/js/many/2.txt', data: 'two' },
    ])
    seen.several = several.map((w) => w.path)
    seen.list = (await sandbox.files.list('/tmp/js')).map((e) => [e.name, e.type]).sort()
    seen.listDeep = (await sandbox.files.list('/tmp/js', { depth: 2 })).map((e) => e.path).sort()
    seen.makeDir = [await sandbox.files.makeDir('/tmp/js/d/e'), await sandbox.files.makeDir('/tmp/js/d/e')]
    const info = await sandbox.files.getInfo('/tmp/js/a.txt')
    seen.info = { name: info.name, type: info.type, size: info.size, isFile: info.type === FileType.FILE }
    seen.exists = [await sandbox.files.exists('/tmp/js/a.txt'), await sandbox.files.exists('/tmp/js/none')]
    seen.renamed = (await sandbox.files.rename('/tmp/js/a.txt', '/tmp/js/c.txt')).path
    await sandbox.files.remove('/tmp/js/many')
    seen.afterRemove = (await sandbox.files.list('/tmp/js')).map((e) => e.name).sort()

    // A watcher: events from after watchDir returns are seen, as envd's.
    const events = []
    const created = signal()
    const watcher = await sandbox.files.watchDir('/tmp/js', (event) => {
      events.push([event.name, event.type])
      if (event.name === 'watched.txt') created.settle()
    })
    await sandbox.files.write('/tmp/js/watched.txt', 'x')
    await created.promise
    await watcher.stop()
    seen.watched = events.filter(([name]) => name === 'watched.txt').map(([, type]) => type)

    seen.readMissing = await failure(sandbox.files.read('/tmp/js/none'))
    seen.infoMissing = await failure(sandbox.files.getInfo('/tmp/js/none'))
    seen.watchMissing = await failure(sandbox.files.watchDir('/tmp/none', () => {}))
    seen.writeRootAsUser = await failure(sandbox.files.write('/root/x', 'x'))
  } finally {
    await sandbox.kill()
  }
  return seen
})
