"""The page as the policy sees it (a text accessibility tree) and as the verifier reads it (its state).

:data:`TREE_JS` walks the DOM in document order and renders one line per visible element the
policy can act on or read: ``[ref] role "name"`` plus its state (``value``, ``checked``) for
controls, ``text "..."`` for visible text outside them. Roles and names follow the ARIA rules in a
reduced form (explicit ``role``; the implicit role of ``button``, ``a[href]``, ``input``,
``textarea``, ``select``, headings; the name from ``aria-label``, the control's ``<label>``,
``placeholder``, ``alt``, ``title`` or its text). Each control keeps its ``ref`` for the whole
episode (a ``data-of-ref`` attribute), so an action names the element the model saw.

:data:`STATE_JS` reads what a verifier needs from the final page: URL, title, the body's
``data-*`` attributes (where the task pages record what was done) and every form field's value
and checked state.
"""

from __future__ import annotations

from typing import Any, Final

from playwright.async_api import Page

#: Attribute holding an element's ref.
REF_ATTR: Final = "data-of-ref"

TREE_JS: Final = """
() => {
  const INTERACTIVE = new Set(["button", "link", "textbox", "searchbox", "checkbox", "radio",
    "combobox", "option", "switch", "menuitem", "tab", "slider", "spinbutton"]);
  const clean = (s) => (s || "").replace(/\\s+/g, " ").trim();
  const visible = (el) => {
    const st = getComputedStyle(el);
    return st.display !== "none" && st.visibility !== "hidden" && !el.hidden;
  };
  const roleOf = (el) => {
    const explicit = el.getAttribute("role");
    if (explicit) return explicit;
    const tag = el.tagName.toLowerCase();
    if (tag === "button") return "button";
    if (tag === "a" && el.hasAttribute("href")) return "link";
    if (tag === "textarea") return "textbox";
    if (tag === "select") return "combobox";
    if (/^h[1-6]$/.test(tag)) return "heading";
    if (tag === "input") {
      const t = (el.getAttribute("type") || "text").toLowerCase();
      if (t === "hidden") return "";
      if (t === "checkbox" || t === "radio") return t;
      if (t === "submit" || t === "button" || t === "reset") return "button";
      if (t === "search") return "searchbox";
      if (t === "range") return "slider";
      if (t === "number") return "spinbutton";
      return "textbox";
    }
    return "";
  };
  const nameOf = (el) => {
    const aria = el.getAttribute("aria-label");
    if (aria) return clean(aria);
    if (el.labels && el.labels.length) return clean(el.labels[0].innerText);
    const tag = el.tagName.toLowerCase();
    if (tag === "input" && ["submit", "button", "reset"].includes(el.type)) return clean(el.value);
    for (const a of ["placeholder", "alt", "title"]) if (el.getAttribute(a)) return clean(el.getAttribute(a));
    if (tag === "input" || tag === "select" || tag === "textarea") return "";
    return clean(el.innerText);
  };
  let next = window.__ofNextRef || 1;
  const lines = [];
  const walk = (node, depth) => {
    for (const child of node.childNodes) {
      if (child.nodeType === Node.TEXT_NODE) {
        const t = clean(child.textContent);
        const parent = child.parentElement;
        if (t && parent && parent.tagName !== "LABEL" && parent.tagName !== "OPTION"
            && !["SCRIPT", "STYLE"].includes(parent.tagName)) {
          lines.push("  ".repeat(depth) + 'text "' + t + '"');
        }
        continue;
      }
      if (child.nodeType !== Node.ELEMENT_NODE || !visible(child)) continue;
      if (["SCRIPT", "STYLE", "HEAD"].includes(child.tagName)) continue;
      const role = roleOf(child);
      if (INTERACTIVE.has(role)) {
        let ref = child.getAttribute("REF_ATTR");
        if (!ref) { ref = String(next++); child.setAttribute("REF_ATTR", ref); }
        let line = "  ".repeat(depth) + "[" + ref + "] " + role + ' "' + nameOf(child) + '"';
        if (role === "checkbox" || role === "radio") line += child.checked ? " checked" : " unchecked";
        else if ("value" in child && role !== "button") line += ' value="' + clean(String(child.value)) + '"';
        if (child.disabled) line += " disabled";
        lines.push(line);
        if (child.tagName === "SELECT") walk(child, depth + 1);
        continue;
      }
      if (role === "heading") { lines.push("  ".repeat(depth) + 'heading "' + nameOf(child) + '"'); continue; }
      walk(child, depth);
    }
  };
  walk(document.body, 0);
  window.__ofNextRef = next;
  return lines.join("\\n");
}
""".replace("REF_ATTR", REF_ATTR)

STATE_JS: Final = """
() => ({
  url: location.href,
  title: document.title,
  data: Object.assign({}, document.body ? document.body.dataset : {}),
  fields: Array.from(document.querySelectorAll("input, textarea, select")).map((el) => ({
    ref: el.getAttribute("REF_ATTR") || "",
    id: el.id,
    name: el.getAttribute("name") || "",
    type: el.type || el.tagName.toLowerCase(),
    value: String(el.value),
    checked: !!el.checked,
  })),
})
""".replace("REF_ATTR", REF_ATTR)


async def accessibility_tree(page: Page) -> str:
    """The page as indented text lines (see the module docstring); assigns refs on first sight."""
    text: str = await page.evaluate(TREE_JS)
    return text


async def page_state(page: Page) -> dict[str, Any]:
    """The state a verifier reads: ``{"url", "title", "data": {...}, "fields": [...]}``."""
    state: dict[str, Any] = await page.evaluate(STATE_JS)
    return state


def ref_selector(ref: str | int) -> str:
    """The CSS selector of the element with ``ref``."""
    return f'[{REF_ATTR}="{int(ref)}"]'
