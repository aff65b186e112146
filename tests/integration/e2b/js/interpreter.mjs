// @e2b/code-interpreter: runCode (state across cells, streamed output, results,
// errors), bash, and a context with its own cwd, on podbay's "base" template.
import { Sandbox } from '@e2b/code-interpreter'
import { main } from './common.mjs'

main(async () => {
  const sandbox = await Sandbox.create('base')
  const seen = {}
  try {
    await sandbox.runCode('x = 41')
    const stdout = []
    const execution = await sandbox.runCode('print("line"); x + 1', {
      onStdout: (message) => stdout.push(message.line),
    })
    seen.cell = {
      text: execution.text,
      stdout: execution.logs.stdout,
      streamed: stdout,
      count: execution.executionCount > 0,
    }
    const failed = await sandbox.runCode('1 / 0')
    seen.error = { name: failed.error?.name, value: failed.error?.value }
    seen.bash = (await sandbox.runCode('echo $((6*7))', { language: 'bash' })).logs.stdout
    const context = await sandbox.createCodeContext({ cwd: '/tmp' })
    seen.contextCwd = (await sandbox.runCode('import os; os.getcwd()', { context })).text
    seen.contextOwnState = (await sandbox.runCode("'x' in globals()", { context })).text
    seen.contexts = (await sandbox.listCodeContexts()).some((c) => c.id === context.id)
    await sandbox.removeCodeContext(context)
    seen.contextsAfterRemove = (await sandbox.listCodeContexts()).some((c) => c.id === context.id)
  } finally {
    await sandbox.kill()
  }
  return seen
})
