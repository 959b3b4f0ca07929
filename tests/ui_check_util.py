"""ui_check_util.py - what the Python-driven checks of what a person sees
share (watch_check.py, report_check.py): their ok/FAIL lines and a
neoflowd of a check's own (a socket and a cache in its directory)."""

import os
import signal
import subprocess
import time


failures = []


def check(ok, what):
    """Prints ok or FAIL and what; a failure is remembered in failures."""
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


class PrivateDaemon:
    """Starts NEOFLOWD on DIR/run/d.sock with its cache in DIR; .sock is its
    address; stop() ends it (SIGTERM) and waits."""

    def __init__(self, neoflowd, tmp, env):
        self.sock = os.path.join(tmp, "run", "d.sock")
        conf = os.path.join(tmp, "d.conf")
        with open(conf, "w") as f:
            f.write("[daemon]\nsocket = %s\n[cache]\ncache = %s\n"
                    % (self.sock, os.path.join(tmp, "c.db")))
        self.log = open(os.path.join(tmp, "d.log"), "w")
        self.proc = subprocess.Popen([neoflowd, "--config", conf], stdout=self.log,
                                     stderr=subprocess.STDOUT, env=env)
        for _ in range(400):
            if os.path.exists(self.sock):
                break
            time.sleep(0.025)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)
        self.log.close()
