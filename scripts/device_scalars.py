"""What each recipe run of the device check logged (TensorBoard scalars), to compare with the CPU
runs: ``python scripts/device_scalars.py RUNS_DIR``."""

import glob
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

for path in sorted(glob.glob(sys.argv[1] + "/*/version_*/events.out.tfevents.*")):
    events = EventAccumulator(path, size_guidance={"scalars": 0})
    events.Reload()
    print("==", "/".join(path.split("/")[-3:-1]))
    for tag in sorted(events.Tags()["scalars"]):
        shown = tag.startswith(("train/", "rollout/success", "val/avg", "time/"))
        if shown and not tag.endswith(("_low", "_high")):
            print(f"  {tag}: " + ", ".join(f"{e.step}:{e.value:.4g}" for e in events.Scalars(tag)))
