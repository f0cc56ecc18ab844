// homing dashboard: refresh the live part of a page every few seconds (no build step, no CDN).
// The server renders the same page with only its content when asked with X-Homing-Fragment.
(function () {
  var main = document.getElementById("live");
  if (!main || !main.dataset.live) return;
  var every = 3000;
  function tick() {
    if (document.hidden) return setTimeout(tick, every);
    fetch(window.location.href, { headers: { "X-Homing-Fragment": "1" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html !== null && !main.contains(document.activeElement)) main.innerHTML = html;
        setTimeout(tick, every);
      })
      .catch(function () { setTimeout(tick, every * 3); });
  }
  setTimeout(tick, every);
})();
