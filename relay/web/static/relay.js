// relay web: live updates through server-sent events. Everything an agent wrote is set as text
// (textContent), never as markup; the page has no inline script (its CSP forbids it).
(function () {
  "use strict";
  var body = document.body;
  var live = body.dataset.live;
  if (!live || !window.EventSource) { return; }
  var after = body.dataset.after || "";
  var state = document.getElementById("live-state");
  var source = new EventSource("/events" + (after ? "?after=" + encodeURIComponent(after) : ""));
  function say(text) { if (state) { state.textContent = text; } }
  source.addEventListener("open", function () { say("live"); });
  source.addEventListener("error", function () { say("reconnecting…"); });
  function time(at) {
    if (typeof at !== "number") { return String(at); }
    return new Date(at * 1000).toISOString().slice(11, 19);
  }
  function item(e) {
    var li = document.createElement("li");
    li.dataset.event = String(e.event);
    li.dataset.id = e.id ? String(e.id) : "";
    var t = document.createElement("time");
    t.textContent = time(e.at);
    li.appendChild(t);
    if (e.id) {
      var a = document.createElement("a");
      a.href = "/messages/" + encodeURIComponent(String(e.id));
      a.textContent = " " + String(e.id);
      li.appendChild(a);
    }
    var ev = document.createElement("span");
    ev.className = "ev";
    ev.textContent = String(e.event);
    li.appendChild(ev);
    var rest = [];
    if (e.from) { rest.push("from " + String(e.from)); }
    if (e.detail) { rest.push(String(e.detail)); }
    li.appendChild(document.createTextNode(rest.join(": ")));
    return li;
  }
  source.addEventListener("update", function (message) {
    var doc = JSON.parse(message.data);
    var total = 0;
    Object.keys(doc.counts || {}).forEach(function (k) {
      total += doc.counts[k];
      var el = document.getElementById("count-" + k);
      if (el) { el.textContent = String(doc.counts[k]); }
    });
    Object.keys(doc.headline || {}).forEach(function (k) {
      var card = document.getElementById("head-" + k);
      var figure = card && card.querySelector("b");
      if (figure) { figure.textContent = String(doc.headline[k]); }
    });
    var all = document.getElementById("count-total");
    if (all) { all.textContent = String(total); }
    var list = document.getElementById("live-events");
    if (list) {
      var none = document.getElementById("live-none");
      if (none) { none.remove(); }
      (doc.events || []).forEach(function (e) { list.insertBefore(item(e), list.firstChild); });
      while (list.children.length > 100) { list.removeChild(list.lastChild); }
    }
    var fresh = document.getElementById("live-new");
    if (fresh && (doc.events || []).some(function (e) { return e.event === "discovered" || e.event === "delivered"; })) {
      fresh.hidden = false;
    }
  });
}());
