"""Step logging shared by the device scripts (hf_parity.py, throughput.py): each line stamped
with the script's tag and the time, printed at once and appended to a log file once one is set;
attempt() runs one step and reports a failure with its traceback instead of stopping the run."""
import time
import traceback


class StepLog:
    def __init__(self, tag):
        self.tag = tag
        self.file = None  # set by the script once its output folder is known

    def log(self, msg):
        line = f"[{self.tag} {time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        if self.file:
            with open(self.file, "a") as f:
                f.write(line + "\n")

    def attempt(self, what, fn, *args, **kwargs):
        """Runs one step; a failure is logged with its traceback and returns None."""
        self.log(f"{what} ...")
        t0 = time.time()
        try:
            result = fn(*args, **kwargs)
            self.log(f"{what}: done in {time.time() - t0:.1f} s")
            return result
        except Exception as e:  # noqa: BLE001 - every failure is reported, the run goes on
            self.log(f"{what}: FAILED after {time.time() - t0:.1f} s: {type(e).__name__}: {e}")
            for line in traceback.format_exc().rstrip().splitlines():
                self.log("  " + line)
            return None
