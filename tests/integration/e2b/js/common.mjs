// What every scenario shares. The SDK is pointed at podbay by the environment
// only (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY), as a user would: the
// scenarios pass no connection options.
import { SandboxError } from 'e2b'

/** Runs a scenario and prints what it observed as one JSON line (for pytest). */
export async function main(scenario) {
  try {
    const observed = await scenario()
    process.stdout.write(JSON.stringify(observed) + '\n')
  } catch (error) {
    console.error(error)
    process.exitCode = 1
  }
}

/** How a call failed, in the SDK's terms: its error class, or null if it did not. */
export async function failure(promise) {
  try {
    await promise
    return null
  } catch (error) {
    return {
      name: error?.constructor?.name,
      sandboxError: error instanceof SandboxError,
      message: String(error?.message),
      exitCode: error?.exitCode,
      stderr: error?.stderr,
    }
  }
}

/** A promise and the function that settles it, for awaiting an event. */
export function signal() {
  let settle
  const promise = new Promise((resolve) => (settle = resolve))
  return { promise, settle }
}

/** Text collected from a stream of chunks, awaited by a marker. */
export class Collected {
  constructor() {
    this.text = ''
    this.waiters = []
  }
  add = (chunk) => {
    this.text += typeof chunk === 'string' ? chunk : new TextDecoder().decode(chunk)
    this.waiters = this.waiters.filter(({ marker, settle }) => {
      if (!this.text.includes(marker)) return true
      settle(this.text)
      return false
    })
  }
  until(marker) {
    if (this.text.includes(marker)) return Promise.resolve(this.text)
    return new Promise((settle) => this.waiters.push({ marker, settle }))
  }
}
