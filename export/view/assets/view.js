// Keyboard navigation: ← and → move between the steps of an attempt (the
// URL's #step-N, a deep link), j and k to the next and previous attempt.
(function () {
  function steps() { return Array.from(document.querySelectorAll('.steps .step')); }
  function current(list) {
    var id = location.hash.slice(1);
    var i = list.findIndex(function (s) { return s.id === id; });
    return i < 0 ? 0 : i;
  }
  function mark() {
    var list = steps(), i = current(list);
    document.querySelectorAll('.strip a').forEach(function (a, k) {
      a.style.borderColor = k === i ? '#ff00ff' : 'transparent';
    });
  }
  document.addEventListener('keydown', function (e) {
    if (e.altKey || e.ctrlKey || e.metaKey || /INPUT|SELECT|TEXTAREA/.test(e.target.tagName)) return;
    var list = steps();
    if ((e.key === 'ArrowRight' || e.key === 'ArrowLeft') && list.length) {
      var i = current(list) + (e.key === 'ArrowRight' ? 1 : -1);
      if (i >= 0 && i < list.length) location.hash = list[i].id;
      e.preventDefault();
      return;
    }
    var rel = { j: 'next', k: 'prev' }[e.key];
    if (rel) {
      var a = document.querySelector('a[data-nav="' + rel + '"]');
      if (a) location.href = a.href;
    }
  });
  window.addEventListener('hashchange', mark);
  document.addEventListener('DOMContentLoaded', mark);
})();
