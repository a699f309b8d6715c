// Live runs list: the first page's rows are fetched again every few seconds and replaced.
// The rows come from the server already escaped; nothing else here touches the page.
"use strict";
(function () {
  var rows = document.getElementById("rows");
  if (!rows || !rows.dataset.live) return;
  var url = rows.dataset.live;
  var busy = false;
  setInterval(function () {
    if (busy || document.hidden) return;
    busy = true;
    fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) { if (html !== null) rows.innerHTML = html; })
      .catch(function () {})
      .finally(function () { busy = false; });
  }, 2000);
})();
