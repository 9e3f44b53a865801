/* The dashboard's "Refresh every N s" toggle (django_dbqueue/admin, docs/admin.md).
 * A file of its own, not an inline script, so a strict Content-Security-Policy
 * (script-src 'self') allows it. The choice is kept in localStorage, per browser. */
(function () {
  "use strict";
  var KEY = "django_dbqueue.dashboard.refresh";
  var box = document.getElementById("dbq-refresh");
  if (!box) {
    return;
  }
  var seconds = parseInt(box.getAttribute("data-seconds"), 10) || 10;
  var timer = null;

  function remembered() {
    try {
      return window.localStorage.getItem(KEY) === "on";
    } catch (error) {  // storage disabled: the toggle still works for this page
      return false;
    }
  }

  function remember(on) {
    try {
      window.localStorage.setItem(KEY, on ? "on" : "off");
    } catch (error) {
      /* nothing to keep it in */
    }
  }

  function reload() {
    if (document.hidden) {
      timer = null;  // a hidden tab costs the database nothing; it refreshes when shown
      return;
    }
    window.location.reload();
  }

  function schedule() {
    window.clearTimeout(timer);
    timer = box.checked ? window.setTimeout(reload, seconds * 1000) : null;
  }

  box.checked = remembered();
  box.addEventListener("change", function () {
    remember(box.checked);
    schedule();
  });
  document.addEventListener("visibilitychange", function () {
    if (!document.hidden && box.checked && timer === null) {
      reload();
    }
  });
  schedule();
}());
