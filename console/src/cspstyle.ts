// xterm.js writes its theme and cell sizes into <style> elements it creates.
// The console's Content-Security-Policy allows no inline style (a sandbox must
// not get a foothold for CSS injection either), so those elements would be
// refused (an empty one too). Constructed stylesheets are CSSOM, which CSP
// allows: asked for a <style>, the page gets an inert <template> instead, and
// what is written to its text goes into a constructed sheet adopted by the
// document, which leaves with the element. xterm.js only sets the text and
// removes the element.

export function routeStyleElementsToConstructedSheets(): void {
  const original = Document.prototype.createElement;
  function createElement(this: Document, tag: string, options?: ElementCreationOptions): HTMLElement {
    if (tag.toLowerCase() !== "style") return original.call(this, tag, options);
    const el = original.call(this, "template");
    const sheet = new CSSStyleSheet();
    let text = "";
    const doc = this;
    Object.defineProperty(el, "textContent", {
      get: () => text,
      set: (value: string | null) => {
        text = value ?? "";
        sheet.replaceSync(text);
        if (!doc.adoptedStyleSheets.includes(sheet)) doc.adoptedStyleSheets = [...doc.adoptedStyleSheets, sheet];
      },
    });
    const remove = el.remove.bind(el);
    el.remove = () => {
      doc.adoptedStyleSheets = doc.adoptedStyleSheets.filter((s) => s !== sheet);
      remove();
    };
    return el;
  }
  Document.prototype.createElement = createElement as typeof Document.prototype.createElement;
}
