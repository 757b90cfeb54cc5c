// Keel dashboard behaviour: repeatable rows, range read-outs, live validation marks, copy buttons.
// Everything is delegated from the document, so content that htmx swaps in works without re-binding.
(function () {
  "use strict";

  // The Content-Security-Policy (config/middleware.py) allows no inline <style> and no eval: htmx's
  // indicator styles are in keel.css instead, and htmx evaluates no expressions. (Script tags in swapped
  // content stay allowed: htmx would drop the json_script data blocks with them, and an inline script
  // there could not run under the policy anyway.) htmx reads its configuration when the document is
  // ready, after this deferred script has run.
  if (window.htmx) {
    window.htmx.config.includeIndicatorStyles = false;
    window.htmx.config.allowEval = false;
  }

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
  // --- Trajectories --------------------------------------------------------------------------------

  // Filter forms marked data-drop-empty send only the fields that say something, so the URL that
  // htmx pushes stays short enough to share.
  document.addEventListener("htmx:configRequest", function (event) {
    var element = event.detail.elt;
    if (!element || !element.hasAttribute || !element.hasAttribute("data-drop-empty")) { return; }
    var parameters = event.detail.parameters;
    Object.keys(parameters).forEach(function (name) {
      if (parameters[name] === "") { delete parameters[name]; }
    });
  });

  document.addEventListener("change", function (event) {
    var target = event.target;
    // A select marked data-autosubmit sends its form when it changes (no inline handler: see the CSP).
    if (target.hasAttribute && target.hasAttribute("data-autosubmit") && target.form) {
      target.form.submit();
      return;
    }
    if (target.name === "period" && target.form && target.form.hasAttribute("data-drop-empty")) {
      var custom = target.form.querySelector("[data-custom-range]");
      if (custom) { custom.hidden = target.value !== "custom"; }
    }
    if (target.name === "data_type" && target.form && target.form.hasAttribute("data-score-form")) {
      target.form.setAttribute("data-type", target.value);
    }
    if (target.name === "divergence" && target.form && target.form.hasAttribute("data-replay-form")) {
      target.form.setAttribute("data-divergence", target.value);
    }
  });

  function stepList() { return document.querySelector("[data-steps]"); }

  function visibleSteps(list) {
    return Array.prototype.filter.call(list.querySelectorAll("[data-step]"), function (step) { return !step.hidden; });
  }

  function fillPanel(step) {
    var data = step.dataset;
    var values = {
      step: data.step, kind: data.kind, title: data.title, status: data.status, offset: data.offset,
      duration: data.duration, tokens: data.tokens, cost: data.cost, model: data.model, span: data.span, error: data.error
    };
    document.querySelectorAll("[data-panel]").forEach(function (slot) {
      slot.textContent = values[slot.getAttribute("data-panel")] || "—";
    });
    var error = document.querySelector("[data-panel-error]");
    if (error) { error.hidden = !data.error; }
    var link = document.querySelector("[data-panel-link]");
    if (link) {
      link.setAttribute("href", "#step-" + data.step);
      link.setAttribute("data-step-link", data.step);
    }
    var option = document.querySelector("[data-selected-step-option]");
    if (option && !option.selected) {
      option.value = data.span;
      option.textContent = "Step " + data.step + " · " + data.title;
    }
    document.querySelectorAll("[data-replay-step]").forEach(function (input) { input.value = data.step; });
    document.querySelectorAll("[data-replay-step-label]").forEach(function (label) {
      label.textContent = "step " + data.step + " (" + data.kind + " " + data.title + ")";
    });
    document.querySelectorAll(".wf-row.is-current").forEach(function (row) { row.classList.remove("is-current"); });
    var row = document.querySelector('.wf-row[data-step-link="' + data.step + '"]');
    if (row) { row.classList.add("is-current"); }
  }

  function selectStep(step, options) {
    var list = step.closest("[data-steps]");
    var current = list.querySelector("[data-step].is-selected");
    if (current && current !== step) {
      current.classList.remove("is-selected");
      current.setAttribute("tabindex", "-1");
      current.removeAttribute("aria-current");
    }
    step.classList.add("is-selected");
    step.setAttribute("tabindex", "0");
    step.setAttribute("aria-current", "step");
    if (options.focus) { step.focus({ preventScroll: true }); }
    if (options.scroll) { step.scrollIntoView({ block: "nearest" }); }
    fillPanel(step);
    if (options.remember && window.history.replaceState) {
      window.history.replaceState(null, "", "#step-" + step.getAttribute("data-step"));
    }
  }

  function revealStep(step) {
    // A step folded into a collapsed sub-agent opens its ancestors first.
    var depth = parseInt(step.getAttribute("data-depth"), 10);
    var previous = step.previousElementSibling;
    while (step.hidden && previous) {
      var previousDepth = parseInt(previous.getAttribute("data-depth"), 10);
      if (previousDepth < depth) {
        if (previous.classList.contains("is-collapsed")) { setCollapsed(previous, false); }
        depth = previousDepth;
      }
      previous = previous.previousElementSibling;
    }
  }

  function toggleExpanded(step) {
    var folded = step.querySelectorAll(".step-body details");
    var expand = !step.classList.contains("is-expanded");
    step.classList.toggle("is-expanded", expand);
    folded.forEach(function (details) { details.open = expand; });
  }

  function applyCollapse(list) {
    // Hide what collapsed steps hold; in timeline mode nothing is hidden.
    var tree = list.getAttribute("data-mode") === "tree";
    var hideBelow = null;
    list.querySelectorAll("[data-step]").forEach(function (step) {
      var depth = parseInt(step.getAttribute("data-depth"), 10);
      if (hideBelow !== null && depth <= hideBelow) { hideBelow = null; }
      step.hidden = tree && hideBelow !== null;
      if (tree && hideBelow === null && step.classList.contains("is-collapsed")) { hideBelow = depth; }
    });
  }

  function setCollapsed(step, collapsed) {
    step.classList.toggle("is-collapsed", collapsed);
    var toggle = step.querySelector("[data-step-toggle]");
    if (toggle) {
      toggle.setAttribute("aria-expanded", collapsed ? "false" : "true");
      toggle.setAttribute("title", collapsed ? "Expand the steps inside" : "Collapse the steps inside");
    }
    applyCollapse(step.closest("[data-steps]"));
  }

  function setMode(list, mode) {
    list.setAttribute("data-mode", mode);
    document.querySelectorAll("[data-steps-mode]").forEach(function (button) {
      button.setAttribute("aria-pressed", button.getAttribute("data-steps-mode") === mode ? "true" : "false");
    });
    applyCollapse(list);
    try { window.localStorage.setItem("keel.steps.mode", mode); } catch (error) { /* private mode */ }
  }

  document.addEventListener("click", function (event) {
    var list = stepList();
    if (!list) { return; }
    var mode = event.target.closest("[data-steps-mode]");
    if (mode) { setMode(list, mode.getAttribute("data-steps-mode")); return; }
    var toggle = event.target.closest("[data-step-toggle]");
    if (toggle) {
      var parent = toggle.closest("[data-step]");
      setCollapsed(parent, !parent.classList.contains("is-collapsed"));
      return;
    }
    var link = event.target.closest("[data-step-link]");
    if (link) {
      var linked = document.getElementById("step-" + link.getAttribute("data-step-link"));
      if (linked) {
        event.preventDefault();
        revealStep(linked);
        selectStep(linked, { focus: true, scroll: true, remember: true });
      }
      return;
    }
    var replayHere = event.target.closest("[data-replay-here]");
    if (replayHere) {
      var from = document.querySelector("[data-replay-step]");
      if (from) { event.preventDefault(); from.focus(); from.scrollIntoView({ block: "center" }); }
      return;
    }
    var scoreStep = event.target.closest("[data-score-step]");
    if (scoreStep) {
      var option = document.querySelector("[data-selected-step-option]");
      if (option) { option.selected = true; }
      var name = document.getElementById("id_name");
      if (name) { event.preventDefault(); name.focus(); name.scrollIntoView({ block: "center" }); }
      return;
    }
    var head = event.target.closest("[data-step] .step-head");
    if (head && !event.target.closest("a, button, summary, input, select, textarea")) {
      selectStep(head.closest("[data-step]"), { focus: true, remember: true });
    }
  });

  document.addEventListener("keydown", function (event) {
    var list = stepList();
    if (!list || event.defaultPrevented || event.altKey || event.ctrlKey || event.metaKey) { return; }
    var target = event.target;
    if (target.closest && target.closest("input, textarea, select, [contenteditable]")) { return; }
    var key = event.key;
    var forward = key === "j" || key === "ArrowDown";
    var back = key === "k" || key === "ArrowUp";
    // Arrows keep scrolling the page unless the focus is on the steps (or nowhere in particular).
    var onSteps = list.contains(target) || target === document.body || target.id === "main";
    if ((key === "ArrowDown" || key === "ArrowUp") && !onSteps) { return; }
    if (forward || back) {
      var steps = visibleSteps(list);
      if (!steps.length) { return; }
      var position = steps.indexOf(list.querySelector("[data-step].is-selected"));
      var next = position < 0 ? 0 : Math.min(Math.max(position + (forward ? 1 : -1), 0), steps.length - 1);
      selectStep(steps[next], { focus: true, scroll: true, remember: true });
      event.preventDefault();
    } else if (key === "Enter" && target.matches && target.matches("[data-step]")) {
      toggleExpanded(target);
      event.preventDefault();
    }
  });

  document.addEventListener("DOMContentLoaded", function () {
    var list = stepList();
    if (list) {
      var mode = null;
      try { mode = window.localStorage.getItem("keel.steps.mode"); } catch (error) { mode = null; }
      if (mode === "tree" || mode === "timeline") { setMode(list, mode); }
      var match = /^#step-(\d+)$/.exec(window.location.hash);
      var chosen = match ? document.getElementById("step-" + match[1]) : list.querySelector("[data-step].is-selected");
      if (chosen) {
        revealStep(chosen);
        selectStep(chosen, { focus: Boolean(match), scroll: Boolean(match), remember: false });
      }
    }
    document.querySelectorAll("[data-replay-form]").forEach(function (form) {
      var policy = form.querySelector('input[name="divergence"]:checked');
      form.setAttribute("data-divergence", policy ? policy.value : "stop");
    });
    document.querySelectorAll("[data-score-form]").forEach(function (form) {
      var checked = form.querySelector('input[name="data_type"]:checked');
      form.setAttribute("data-type", checked ? checked.value : "numeric");
    });
  });
})();

// --- Review queue: one key per decision (documented on the page) ----------------------------------------
(function () {
  "use strict";

  function reviewForm() { return document.querySelector("[data-review-form]"); }

  function choose(form, value) {
    var radio = form.querySelector('input[name="decision"][value="' + value + '"]');
    if (radio) { radio.checked = true; }
  }

  document.addEventListener("keydown", function (event) {
    var form = reviewForm();
    if (!form || event.altKey || event.metaKey) { return; }
    var target = event.target;
    var typing = target.closest && target.closest("input[type=text], input[type=search], textarea, select, [contenteditable]");
    if (typing) {
      // Ctrl+Enter in the note saves; every other key types.
      if (event.ctrlKey && event.key === "Enter" && target.closest("[data-review-form]")) {
        event.preventDefault();
        form.requestSubmit();
      }
      return;
    }
    if (event.ctrlKey) { return; }
    var key = event.key;
    var save = form.querySelector("[data-review-save]");
    if (key === "y" || key === "n") {
      choose(form, key === "y" ? "informative" : "not_informative");
    } else if (key === "s") {
      choose(form, "skip");
      event.preventDefault();
      form.requestSubmit();
      return;
    } else if (/^[0-9]$/.test(key)) {
      var select = form.querySelector('select[name="failure_mode"]');
      if (key === "0") {
        select.value = "";
      } else {
        var option = select.querySelector('option[data-key="' + key + '"]');
        if (!option) { return; }
        select.value = option.value;
      }
    } else if (key === "c") {
      var note = form.querySelector('textarea[name="note"]');
      if (note) { event.preventDefault(); note.focus(); }
      return;
    } else if (key === "Enter" && !(target.matches && target.matches("[data-step], a, button, summary"))) {
      event.preventDefault();
      form.requestSubmit();
      return;
    } else {
      return;
    }
    // After a choice, the save button has the focus: Enter saves and moves on.
    event.preventDefault();
    if (save) { save.focus({ preventScroll: true }); }
  });
})();
