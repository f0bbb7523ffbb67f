// dxi view: the only script, served by the app (the Content-Security-Policy allows no other).
// A change to a filter's drop-down or check box applies the filters at once (the Apply button does the
// same without JavaScript); the search field applies on Enter.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  for (const form of document.querySelectorAll("form[data-autosubmit]")) {
    for (const field of form.querySelectorAll("select, input[type=checkbox]")) {
      field.addEventListener("change", () => form.requestSubmit());
    }
    // empty fields stay out of the address, so that links stay short and stable
    form.addEventListener("submit", () => {
      for (const field of form.querySelectorAll("select, input")) {
        if (!field.value || (field.type === "checkbox" && !field.checked)) field.disabled = true;
      }
    });
  }
});
