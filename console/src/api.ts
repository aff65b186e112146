// The console's calls to the server: the session cookie authenticates them
// (the browser sends it; the page never sees it), the CSRF token from the
// session document goes on every state-changing call, and an operator picks
// the deployment a sandbox call is about with X-Podbay-Deployment.

export interface Session {
  scope: "operator" | "deployment";
  deployment: string | null;
  csrf: string;
}

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

let session: Session | null = null;
/** The deployment an operator looks at (a deployment session: its own). */
let deployment: string | null = null;

export function current(): Session | null {
  return session;
}

export function currentDeployment(): string | null {
  return session?.scope === "deployment" ? session.deployment : deployment;
}

export function chooseDeployment(name: string | null): void {
  deployment = name;
  if (name) sessionStorage.setItem("podbay.deployment", name);
  else sessionStorage.removeItem("podbay.deployment");
}

async function refusal(res: Response): Promise<ApiError> {
  let code = "HTTP_" + res.status;
  let message = res.statusText || `HTTP ${res.status}`;
  try {
    const body = (await res.json()) as { error?: unknown; code?: unknown };
    if (typeof body.code === "string") code = body.code;
    if (typeof body.error === "string") message = body.error;
  } catch {
    // not JSON: the status says enough
  }
  return new ApiError(res.status, code, message);
}

export interface CallOptions {
  method?: string;
  body?: unknown;
  raw?: BodyInit;
  headers?: Record<string, string>;
  /** Send X-Podbay-Deployment (sandbox and data-plane calls). */
  scoped?: boolean;
}

export async function call(path: string, opts: CallOptions = {}): Promise<Response> {
  const method = opts.method ?? "GET";
  const headers: Record<string, string> = { ...(opts.headers ?? {}) };
  if (method !== "GET" && method !== "HEAD" && session) headers["X-CSRF-Token"] = session.csrf;
  const dep = currentDeployment();
  if (opts.scoped && session?.scope === "operator" && dep) headers["X-Podbay-Deployment"] = dep;
  let body: BodyInit | undefined = opts.raw;
  if (opts.body !== undefined) {
    headers["Content-Type"] = "application/json";
    body = JSON.stringify(opts.body);
  }
  const res = await fetch(path, { method, headers, body, credentials: "same-origin" });
  if (!res.ok) {
    const err = await refusal(res);
    if (res.status === 401 && session && !path.startsWith("/console/session")) {
      session = null;
      window.dispatchEvent(new CustomEvent("podbay:signed-out"));
    }
    throw err;
  }
  return res;
}

export async function json<T>(path: string, opts: CallOptions = {}): Promise<T> {
  const res = await call(path, opts);
  if (res.status === 204) return undefined as T;
  return (await res.json()) as T;
}

export async function loadSession(): Promise<Session | null> {
  try {
    session = await json<Session>("/console/session");
  } catch {
    session = null;
  }
  if (session?.scope === "operator") deployment = sessionStorage.getItem("podbay.deployment");
  return session;
}

export async function signIn(token: string): Promise<Session> {
  session = await json<Session>("/console/session", { method: "POST", body: { token } });
  deployment = session.scope === "deployment" ? session.deployment : null;
  return session;
}

export async function signOut(): Promise<void> {
  try {
    await call("/console/session", { method: "DELETE" });
  } finally {
    session = null;
    chooseDeployment(null);
  }
}

// -- shapes (docs: the console contract) -------------------------------------

export interface SandboxRow {
  name: string;
  class?: string;
  runtime_class?: string;
  state: string;
  created_at?: string;
  last_active_at?: string;
  node?: string | null;
  template?: string | null;
  labels?: Record<string, string> | null;
}

export interface Sample {
  at: string;
  cpu_percent: number;
  memory_bytes: number;
  memory_limit_bytes?: number | null;
  disk_bytes?: number | null;
  net_rx_bytes?: number | null;
  net_tx_bytes?: number | null;
}

export const enc = encodeURIComponent;

export function sandboxPath(name: string): string {
  return `/api/v1/sandboxes/${enc(name)}`;
}

/** Base of the session's route to one sandbox's data plane (the server
 * attaches it and relays with a credential the page never sees). */
export function dataPath(name: string): string {
  return `/console/sandboxes/${enc(currentDeployment() ?? "")}/${enc(name)}`;
}
