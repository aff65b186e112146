import { signIn, ApiError } from "../api";
import { field, h } from "../dom";
import { navigate } from "../router";

export function signinPage(main: HTMLElement): void {
  const token = h("input", { type: "password", name: "token", autocomplete: "off", required: true, spellcheck: "false" });
  const error = h("p", { class: "error", role: "alert" });
  const form = h(
    "form",
    { class: "card signin", "aria-labelledby": "signin-title" },
    h("h1", { id: "signin-title" }, "Sign in"),
    h("p", { class: "muted" }, "An operator token (podbay admin token) or a deployment's identity token."),
    field("Token", token),
    error,
    h("button", { type: "submit", class: "primary" }, "Sign in"),
  );
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    error.textContent = "";
    try {
      const s = await signIn(token.value.trim());
      token.value = "";
      window.dispatchEvent(new CustomEvent("podbay:signed-in"));
      navigate(s.scope === "operator" ? "/console/app/deployments" : "/console/app/sandboxes", true);
    } catch (e) {
      error.textContent = e instanceof ApiError ? `${e.message} (${e.code})` : "Sign-in failed: the server did not answer.";
      token.focus();
    }
  });
  main.appendChild(form);
  token.focus();
}
