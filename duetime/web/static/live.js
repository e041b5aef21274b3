// Live updates by progressive enhancement: the page works without this script; with it,
// the regions marked data-live are refreshed from the same URL every few seconds (the server
// renders the same template), while the tab is visible and "live" is on.
(function () {
  "use strict";
  var body = document.body;
  var every = Number(body.getAttribute("data-live-every") || 0);
  var toggle = document.getElementById("live-toggle");
  if (!every) { if (toggle) { toggle.parentNode.style.display = "none"; } return; }
  var on = localStorage.getItem("duetime-live") !== "off";
  if (toggle) {
    toggle.checked = on;
    toggle.addEventListener("change", function () {
      on = toggle.checked; localStorage.setItem("duetime-live", on ? "on" : "off");
      body.classList.toggle("live-off", !on);
    });
  }
  body.classList.toggle("live-off", !on);
  var busy = false;
  function refresh() {
    if (!on || busy || document.hidden) { return; }
    busy = true;
    fetch(location.href, { headers: { "X-Duetime-Live": "1" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (!html) { return; }
        var doc = new DOMParser().parseFromString(html, "text/html");
        document.querySelectorAll("[data-live]").forEach(function (el) {
          if (el.querySelector("input[type=checkbox]:checked")) { return; }  // a selection is kept
          var fresh = doc.getElementById(el.id);
          if (fresh && fresh.innerHTML !== el.innerHTML) { el.innerHTML = fresh.innerHTML; }
        });
        body.setAttribute("data-refreshed", String(Date.now()));
      })
      .catch(function () { /* the next tick tries again */ })
      .then(function () { busy = false; });
  }
  setInterval(refresh, every);
})();
