// Uploads the photos chosen or dropped on the upload page one request each, three at a time,
// with a progress bar per file; a file the server refuses shows its error and the others go
// on. Without this script the form posts every file at once.
(function () {
  var form = document.getElementById("upload");
  if (!form) return;
  var input = document.getElementById("photos");
  var zone = document.getElementById("dropzone");
  var list = document.getElementById("uploads");
  var csrf = form.querySelector("input[name=csrf]").value;
  var queue = [], running = 0, PARALLEL = 3;

  function row(file) {
    var li = document.createElement("li");
    var name = document.createElement("span");
    name.textContent = file.name;
    var bar = document.createElement("progress");
    bar.max = 100;
    bar.value = 0;
    var status = document.createElement("span");
    status.className = "status";
    status.textContent = "waiting";
    li.append(name, " ", bar, " ", status);
    list.appendChild(li);
    return { li: li, bar: bar, status: status };
  }

  function finish(r, answer) {
    r.bar.value = 100;
    if (answer.error) {
      r.li.className = "failed";
      r.status.className = "status error";
      r.status.textContent = answer.error;
      return;
    }
    r.li.className = "done";
    var a = document.createElement("a");
    a.href = "/ui/photos/" + answer.id;
    a.textContent = "photo " + answer.id;
    r.status.textContent = "";
    r.status.appendChild(a);
    if (answer.duplicate_of) r.status.append(" (already stored)");
  }

  function send(job) {
    running++;
    job.r.status.textContent = "uploading";
    var body = new FormData();
    body.append("csrf", csrf);
    body.append("photos", job.file, job.file.name);
    var xhr = new XMLHttpRequest();
    xhr.open("POST", form.action);
    xhr.setRequestHeader("Accept", "application/json");
    xhr.upload.onprogress = function (e) {
      if (e.lengthComputable) job.r.bar.value = (100 * e.loaded) / e.total;
    };
    xhr.onload = function () {
      var answer;
      try {
        answer = JSON.parse(xhr.responseText).files[0];
      } catch (e) {
        answer = { error: "refused: HTTP " + xhr.status };
      }
      finish(job.r, answer);
    };
    xhr.onerror = function () {
      finish(job.r, { error: "the upload did not reach the server" });
    };
    xhr.onloadend = function () {
      running--;
      next();
    };
    xhr.send(body);
  }

  function next() {
    while (running < PARALLEL && queue.length) send(queue.shift());
  }

  function add(files) {
    Array.prototype.forEach.call(files, function (file) {
      queue.push({ file: file, r: row(file) });
    });
    next();
  }

  input.addEventListener("change", function () {
    add(input.files);
    input.value = "";
  });
  form.addEventListener("submit", function (e) {
    e.preventDefault();
  });
  zone.addEventListener("dragover", function (e) {
    e.preventDefault();
    zone.classList.add("over");
  });
  zone.addEventListener("dragleave", function () {
    zone.classList.remove("over");
  });
  zone.addEventListener("drop", function (e) {
    e.preventDefault();
    zone.classList.remove("over");
    add(e.dataTransfer.files);
  });
})();
