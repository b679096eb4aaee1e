// outbox console: optional auto-refresh. Every page works without it.
(function () {
  "use strict";
  var label = document.querySelector(".refresh");
  var box = document.getElementById("autorefresh");
  // Pages with forms that change things never refresh on their own.
  if (!label || !box || document.querySelector("form[method=post]")) { return; }
  label.hidden = false;
  var key = "outbox-console-refresh";
  var timer = null;
  function arm() {
    if (timer) { clearTimeout(timer); timer = null; }
    if (box.checked) { timer = setTimeout(function () { location.reload(); }, 10000); }
  }
  try { box.checked = localStorage.getItem(key) === "1"; } catch (e) { /* storage blocked */ }
  box.addEventListener("change", function () {
    try { localStorage.setItem(key, box.checked ? "1" : "0"); } catch (e) { /* storage blocked */ }
    arm();
  });
  arm();
})();
