// edgefleet console: a little progressive enhancement; every page works without it.
"use strict";
(function () {
  // Filters that apply as soon as a choice changes.
  document.querySelectorAll("select[data-autosubmit]").forEach(function (el) {
    el.addEventListener("change", function () { el.form.submit(); });
  });
  // Buttons that undo work ask first.
  document.querySelectorAll("form[data-confirm]").forEach(bindConfirm);
  function bindConfirm(form) {
    form.addEventListener("submit", function (ev) {
      if (!window.confirm(form.getAttribute("data-confirm"))) { ev.preventDefault(); }
    });
  }
  // The review form by keyboard: c confirms (and goes to the next one when the page
  // walks a filter's queue), o chooses override and its outcome (Enter saves), s saves
  // (and next), n and b follow the page's links. Keys typed into a field are the field's.
  var review = document.querySelector("form.review-form");
  if (review) {
    document.addEventListener("keydown", function (ev) {
      var t = ev.target;
      if (ev.key === "Enter" && t && t.name === "outcome") {  // the override's choice made
        ev.preventDefault();
        (review.querySelector("[data-key=s]") || review.querySelector("button[type=submit]")).click();
        return;
      }
      if (ev.ctrlKey || ev.metaKey || ev.altKey || (t && /^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName))) { return; }
      var save = review.querySelector("[data-key=s]") || review.querySelector("button[type=submit]");
      if (ev.key === "c") {
        review.querySelector("input[value=confirm]").checked = true;
        save.click();
      } else if (ev.key === "o") {
        review.querySelector("input[value=override]").checked = true;
        review.querySelector("select[name=outcome]").focus();
        ev.preventDefault();
      } else if (ev.key === "s") {
        save.click();
      } else {
        var link = document.querySelector("a[data-key='" + ev.key + "']");
        if (link) { window.location.href = link.href; }
      }
    });
  }
  // A live part of a page (rollout progress) is fetched again every few seconds until
  // it says it is finished; a signed-out session reloads the page (to the sign-in).
  var live = document.querySelector("[data-live-url]");
  if (!live || live.hasAttribute("data-terminal")) { return; }
  var url = live.getAttribute("data-live-url");
  var every = 1000 * (parseFloat(live.getAttribute("data-refresh-s")) || 3);
  var busy = false;
  function refresh() {
    if (busy || document.hidden) { return; }
    busy = true;
    fetch(url, { credentials: "same-origin", headers: { "X-Console-Fragment": "1" } })
      .then(function (r) {
        if (r.status === 401) { window.location.reload(); return null; }
        return r.ok ? r.text() : null;
      })
      .then(function (html) {
        if (html === null) { return; }
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.querySelector("section.live");
        var held = live.querySelector("section.live");
        if (fresh && held && fresh.innerHTML !== held.innerHTML) {
          held.replaceWith(document.importNode(fresh, true));
          live.querySelectorAll("form[data-confirm]").forEach(bindConfirm);
        }
        if (fresh && fresh.hasAttribute("data-terminal")) { window.clearInterval(timer); }
      })
      .catch(function () { /* the next round tries again */ })
      .then(function () { busy = false; });
  }
  var timer = window.setInterval(refresh, every);
})();
