#!/usr/bin/env python3
"""watch_check.py NEOFLOW NEOFLOWD - `neoflow status --watch` as a person
sees it, in a terminal driven by tmux (a private tmux server, a window of
140 x 45):

  - with a training run sending its subgraphs to a private daemon, the view
    shows the daemon, the cache, the jobs (a tuning one with its progress
    bar, each named by model, entry, tensor and what it computes) and the
    clients, and is redrawn (its clock moves);
  - lines are cut to the window's width when it shrinks;
  - q ends it with status 0 and the terminal as it was: the shell's lines
    before and after, the alternate screen left, the cursor shown;
  - with the daemon stopped, the view says it is not answering; Ctrl-C
    ends it the same way.

Exit 77 (skipped) without tmux or without a daemon in this build."""

import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ui_check_util import PrivateDaemon, check, failures  # noqa: E402

NEOFLOW, NEOFLOWD = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main():
    if not shutil.which("tmux"):
        print("watch: skipped: no tmux (Debian's tmux; the test command installs it)")
        return 77
    if not NEOFLOWD or not os.path.exists(NEOFLOWD):
        print("watch: skipped: no neoflowd in this build")
        return 77
    tmp = tempfile.mkdtemp(prefix="nf_watch_")
    server = "nfwatch%d" % os.getpid()
    tmux = ["tmux", "-L", server, "-f", "/dev/null"]
    env = dict(os.environ, NEOFLOW_LIB=os.path.join(ROOT, "lib"), NEOFLOW_CONFIG="none",
               NEOFLOW_VERIFIED="none", TERM="xterm-256color")
    d = PrivateDaemon(NEOFLOWD, tmp, env)
    sock = d.sock
    train = None

    def pane():
        # (-J: a line the terminal wrapped comes back whole, so one the view
        # did not cut shows as longer than the window)
        return subprocess.run(tmux + ["capture-pane", "-p", "-J", "-t", "w"], capture_output=True,
                              text=True, env=env).stdout

    def wait_for(pred, secs):
        end = time.time() + secs
        text = pane()
        while time.time() < end and not pred(text):
            time.sleep(0.2)
            text = pane()
        return text

    try:
        train = subprocess.Popen([NEOFLOW, "train", os.path.join(ROOT, "examples", "mlp.nf"), "mlp",
                                  "--data", "synthetic", "--steps", "1000000", "--threads", "1",
                                  "--daemon", sock, "--no-spawn"], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        watch = "'%s' status --watch --socket '%s'" % (NEOFLOW, sock)
        # (the shell ignores Ctrl-C, as an interactive one would not die of
        # it; the view installs its own handler)
        first = os.path.join(tmp, "first.rc")
        script = ("trap '' INT; printf 'BEFORE\\n'; %s; rc=$?; echo \"AFTER1 rc=$rc\"; "
                  "echo $rc > '%s'; %s; echo \"AFTER2 rc=$?\"; sleep 600" % (watch, first, watch))
        subprocess.run(tmux + ["new-session", "-d", "-s", "w", "-x", "140", "-y", "45", "sh", "-c",
                               script], check=True, env=env)
        text = wait_for(lambda t: "tuning" in t and "[#" in t and "libneoflow-client" in t, 30)
        check("neoflowd" in text and "hit rate" in text and "JOB (what it computes)" in text,
              "the view shows the daemon, its cache and the jobs' header:\n" + text[:600])
        named = [ln for ln in text.splitlines() if "mlp_grad#" in ln and "stmt" in ln]
        check(len(named) > 0, "jobs are named by model, entry, tensor and what they compute")
        check(any("tuning" in ln and "[" in ln and "/" in ln for ln in text.splitlines()),
              "a tuning job shows its progress bar and trials")
        check("CLIENT" in text and "libneoflow-client" in text, "the training run is a client")
        clock = [w for w in text.splitlines()[0].split() if w.count(":") == 2]
        time.sleep(2.2)
        later = pane()
        clock2 = [w for w in later.splitlines()[0].split() if w.count(":") == 2]
        check(clock and clock2 and clock != clock2, "the view is redrawn (%s, then %s)"
              % (clock, clock2))
        subprocess.run(tmux + ["resize-window", "-t", "w", "-x", "60", "-y", "45"], env=env)
        narrow = wait_for(lambda t: t.splitlines() and len(t.splitlines()[0]) <= 60
                          and "neoflowd" in t, 5)
        check(all(len(ln) <= 60 for ln in narrow.splitlines()) and "neoflowd" in narrow,
              "lines are cut to a narrower window:\n" + narrow[:300])
        subprocess.run(tmux + ["resize-window", "-t", "w", "-x", "140", "-y", "45"], env=env)
        subprocess.run(tmux + ["send-keys", "-t", "w", "q"], check=True, env=env)
        # (the second view starts at once, on an alternate screen of its own:
        # the first's status is read from the file the shell wrote)
        end = time.time() + 10
        while time.time() < end and not os.path.exists(first):
            time.sleep(0.1)
        time.sleep(0.1)
        rc = open(first).read().strip() if os.path.exists(first) else "(none)"
        check(rc == "0", "q ends the view with status 0 (%s)" % rc)
        # the daemon gone: said so
        d.stop()
        text = wait_for(lambda t: "is not answering" in t, 10)
        check("is not answering" in text and "Trying again" in text,
              "a daemon that went away is said so:\n" + text[:300])
        subprocess.run(tmux + ["send-keys", "-t", "w", "C-c"], check=True, env=env)
        text = wait_for(lambda t: "AFTER2" in t, 10)
        check("AFTER2 rc=0" in text, "Ctrl-C ends the view with status 0")
        lines = [ln for ln in text.splitlines() if ln.strip()]
        check(lines[:3] == ["BEFORE", "AFTER1 rc=0", "AFTER2 rc=0"],
              "the terminal is left as it was: only the shell's own lines remain (%s)" % lines[:6])
        flags = subprocess.run(tmux + ["display", "-p", "-t", "w", "#{alternate_on} #{cursor_flag}"],
                               capture_output=True, text=True, env=env).stdout.split()
        check(flags == ["0", "1"], "the alternate screen is left and the cursor shown (%s)" % flags)
    finally:
        subprocess.run(tmux + ["kill-server"], capture_output=True, env=env)
        if train:
            train.kill()
            train.wait()
        d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print("watch: %d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
