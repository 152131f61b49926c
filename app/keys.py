"""The page by keyboard and on a projector: what the browser runs beside Gradio's own scripts.

- Focus shows on every control (a thick amber ring: visible from the back of a room).
- A radio group moves with the arrow keys and is one Tab stop, as native radios are (Gradio names each
  input of a group differently, so the browser does neither).
- A dropdown's option list closes when focus leaves it (Gradio leaves it open over the controls below).
- What a key press draws is scrolled into view: the answers after Run (and focus moves there, so the next
  Tab reaches Present, then the answer's tokens), the layer view after a pick, the row a step reveals.
- The charts' toolbars stay for the mouse and leave the Tab order.
- Export is the Tab stop after Present, and one press downloads the comparison's JSON.
"""

import json

CSS = """
button:focus-visible, input:focus-visible, textarea:focus-visible, select:focus-visible, a:focus-visible,
[tabindex]:focus-visible, label:has(input[type=radio]:focus-visible), label:has(input[type=checkbox]:focus-visible),
.label-wrap:focus-visible { outline: 3px solid #f59e0b !important; outline-offset: 2px !important; }
input[type=range]:focus-visible { outline: 3px solid #f59e0b !important; outline-offset: 4px !important; }
#sd-results:focus, #sd-results:focus-visible { outline: none !important; }
"""

# Gradio scopes the app's CSS to the app's own container; what holds that container is styled from here.
# A phone-wide window: the page's frame shrinks to the window, so nothing scrolls sideways.
PAGE_CSS = "@media (max-width: 600px) { .gradio-container .main { min-width: 0 !important; max-width: 100vw !important; } }"

# Gradio's `js` on launch: runs once when the page loads.
JS = """() => {
  const style = document.createElement('style'); style.textContent = PAGE_CSS; document.head.appendChild(style);
  const settle = () => {
    document.querySelectorAll('.modebar-btn:not([tabindex="-1"])').forEach((b) => b.setAttribute('tabindex', '-1'));
    document.querySelectorAll('input[type=radio]').forEach((radio) => {
      const group = radio.closest('fieldset, .wrap') || radio.parentElement.parentElement;
      const radios = [...group.querySelectorAll('input[type=radio]')];
      const checked = radios.find((r) => r.checked) || radios[0];
      const stop = radio === checked ? '0' : '-1';
      if (radio.getAttribute('tabindex') !== stop) radio.setAttribute('tabindex', stop);
    });
  };
  new MutationObserver(settle).observe(document.body, {childList: true, subtree: true, attributes: true,
                                                      attributeFilter: ['class', 'aria-checked']});
  settle();
  document.addEventListener('keydown', (event) => {
    const radio = event.target;
    if (radio.type !== 'radio') return;
    const step = {ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1}[event.key];
    if (!step) return;
    const group = radio.closest('fieldset, .wrap') || radio.parentElement.parentElement;
    const radios = [...group.querySelectorAll('input[type=radio]')];
    const next = radios[(radios.indexOf(radio) + step + radios.length) % radios.length];
    event.preventDefault();
    next.click(); next.focus(); settle();
  }, true);
  document.addEventListener('focusout', (event) => {
    const box = event.target.closest && event.target.closest('[role=combobox], input[role=listbox]');
    if (!box) return;
    const block = box.closest('.block') || box.parentElement;
    setTimeout(() => { if (!block.contains(document.activeElement)) {
      box.dispatchEvent(new KeyboardEvent('keydown', {key: 'Escape', bubbles: true})); box.blur(); } }, 0);
  });
  window.sdReveal = (selector, block) => {
    const element = document.querySelector(selector);
    if (!element || !element.offsetParent) return false;
    const box = element.getBoundingClientRect();
    if (box.top < 0 || box.bottom > window.innerHeight) element.scrollIntoView({block: block || 'start'});
    return true;
  };
}""".replace("PAGE_CSS", json.dumps(PAGE_CSS))

# The headline's own script (gr.HTML's js_on_load): each run or replay marks its headline with an id of its own
# (`data-reveal`); the first time the page sees an id, it brings the headline and both answers into view and moves
# focus there (so the next Tab reaches Present, then the answer's tokens). While the answers stream, each box shows
# its newest line. The server marks what to reveal, so a script that starts late misses nothing.
REVEAL_JS = """
const reveal = () => {
  const marked = element.querySelector('[data-reveal]');
  const results = document.querySelector('#sd-results');
  document.querySelectorAll('#sd-skip-output .sd-output, #sd-full-output .sd-output').forEach((box) => {
    if (box.querySelector('.sd-cursor')) box.scrollTop = box.scrollHeight; });
  if (!marked || !results || marked.dataset.reveal === element.dataset.revealed) return;
  element.dataset.revealed = marked.dataset.reveal;
  const answer = document.querySelector('#sd-full-output .sd-output');
  const bottom = answer ? answer.getBoundingClientRect().top + Math.min(answer.offsetHeight, 90) : 0;
  if (results.getBoundingClientRect().top < 0 || bottom > window.innerHeight) results.scrollIntoView({block: 'start'});
  results.setAttribute('tabindex', '-1');
  results.focus({preventScroll: true});
};
new MutationObserver(() => requestAnimationFrame(reveal)).observe(element, {childList: true, subtree: true});
requestAnimationFrame(reveal);
"""

# A refusal's note (beside the prompt, beside the replay button): each refusal is new HTML (callbacks.refused), and
# the note comes into view when it changes.
NOTE_JS = """
const show = () => {
  const note = element.querySelector('.sd-refused'); if (!note) return;
  const box = note.getBoundingClientRect();
  if (box.top < 0 || box.bottom > window.innerHeight) note.scrollIntoView({block: 'center'});
};
new MutationObserver(() => requestAnimationFrame(show)).observe(element, {childList: true, subtree: true});
requestAnimationFrame(show);
"""

# Export: the file the server wrote (the File component's value) is downloaded at once, no second press on its link.
DOWNLOAD_JS = """(file) => { if (!file || !file.url) return; const link = document.createElement('a');
  link.href = file.url; link.download = file.orig_name || ''; document.body.appendChild(link); link.click();
  link.remove(); }"""

# A button that runs what the settings now say: Run, pressed as a visitor would.
RUN_JS = "() => { const run = document.querySelector('#sd-run'); if (run && !run.disabled) run.click(); }"

# The Present button: the slides open at the top of the window.
TO_TOP_JS = "() => { window.scrollTo({top: 0}); }"


def reveal_js(selector: str) -> str:
    """A tab's button (Batch, KV cache): once what it draws (`selector`) shows, it comes into view, its top at the
    window's top where it was out of the window."""
    return ("() => { const until = Date.now() + 120000; const go = () => { const e = document.querySelector(SELECTOR); "
            "const box = e && e.offsetParent ? e.getBoundingClientRect() : null; "
            "if (box && box.height > 0) { if (box.top < 0 || box.bottom > window.innerHeight) "
            "e.scrollIntoView({block: 'start'}); return; } if (Date.now() < until) setTimeout(go, 200); }; go(); }"
            ).replace("SELECTOR", json.dumps(selector))
