// Keel dashboard behaviour: repeatable rows, range read-outs, live validation marks, copy buttons.
// Everything is delegated from the document, so content that htmx swaps in works without re-binding.
(function () {
  "use strict";

  function validateSoon(form) {
    if (form && form.hasAttribute("hx-post")) {
      form.dispatchEvent(new Event("change", { bubbles: true }));
    }
  }

  // Rows: a <template> holds a blank row whose names contain __index__; indices only grow, so a
  // removed row's number is never reused and posted names stay unique.
  document.addEventListener("click", function (event) {
    var add = event.target.closest("[data-row-add]");
    if (add) {
      var rows = document.getElementById(add.getAttribute("data-row-add"));
      var template = rows.querySelector("template");
      var index = parseInt(rows.getAttribute("data-next-index"), 10) || 0;
      rows.setAttribute("data-next-index", String(index + 1));
      var holder = document.createElement("div");
      holder.innerHTML = template.innerHTML.split("__index__").join(String(index));
      var row = holder.firstElementChild;
      rows.querySelector("[data-row-list]").appendChild(row);
      var empty = rows.querySelector("[data-rows-empty]");
      if (empty) { empty.hidden = true; }
      var first = row.querySelector("input, select, textarea");
      if (first) { first.focus(); }
      return;
    }
    var remove = event.target.closest("[data-row-remove]");
    if (remove) {
      var item = remove.closest("[data-row]");
      var group = item.closest("[data-rows]");
      var form = item.closest("form");
      item.remove();
      if (!group.querySelector("[data-row]")) {
        var none = group.querySelector("[data-rows-empty]");
        if (none) { none.hidden = false; }
      }
      var adder = group.querySelector("[data-row-add]");
      if (adder) { adder.focus(); }
      validateSoon(form);
      return;
    }
    var copy = event.target.closest("[data-copy]");
    if (copy) {
      var source = document.getElementById(copy.getAttribute("data-copy"));
      var done = function () {
        copy.textContent = "Copied";
        window.setTimeout(function () { copy.textContent = "Copy"; }, 2000);
      };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(source.value).then(done);
      } else {
        source.select();
        document.execCommand("copy");
        done();
      }
    }
  });

  document.addEventListener("input", function (event) {
    var range = event.target;
    if (range.matches && range.matches("input[type=range]")) {
      var output = document.getElementById(range.id + "-output");
      if (output) { output.textContent = range.value; }
    }
  });

  document.addEventListener("focusin", function (event) {
    if (event.target.matches && event.target.matches("[data-select-on-focus]")) { event.target.select(); }
  });

  // After a live validation, mark the inputs: errors on the fields the server named, and a
  // highlight on the fields that feasibility findings point at.
  document.addEventListener("htmx:afterSwap", function (event) {
    var data = document.getElementById("validation-data");
    if (!data || !event.detail.target.contains(data)) { return; }
    var result = JSON.parse(data.textContent);
    document.querySelectorAll("[data-error-for]").forEach(function (slot) {
      slot.textContent = "";
    });
    document.querySelectorAll("[data-field][aria-invalid]").forEach(function (input) {
      input.removeAttribute("aria-invalid");
    });
    document.querySelectorAll(".is-flagged").forEach(function (element) {
      element.classList.remove("is-flagged");
    });
    Object.keys(result.errors).forEach(function (name) {
      var slot = document.querySelector('[data-error-for="' + CSS.escape(name) + '"]');
      if (slot) {
        result.errors[name].forEach(function (message) {
          var item = document.createElement("li");
          item.textContent = message;
          slot.appendChild(item);
        });
      }
      document.querySelectorAll('[data-field="' + CSS.escape(name) + '"]').forEach(function (input) {
        input.setAttribute("aria-invalid", "true");
      });
    });
    result.flagged.forEach(function (name) {
      var wrapper = document.querySelector('[data-wrapper-for="' + CSS.escape(name) + '"]');
      if (wrapper) { wrapper.classList.add("is-flagged"); }
    });
  });
})();
