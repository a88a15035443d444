#!/usr/bin/env python3
"""Does a busy neighbour core slow a one-rank train step? (docs/runtime.md, the GPipe bubble)

bench/pipeline_bubble.py's pipelined contender keeps both cores busy and its one-rank contender
only one, so anything the cores share would stretch the pipelined step alone. This times the
one-rank server that pipeline_bubble.py built (`--microbatches`, default 4) on core 0, alternated
round by round between core 1 idle and core 1 stepping a second copy of the same server, both
under SCHED_FIFO (`chrt -f 1`, as pipeline_bubble.py --realtime). Not a test: prints what it
measured. Run bench/pipeline_bubble.py first.

usage: bench/busy_neighbour.py [--build-dir build] [--microbatches 4] [--rounds 9] [--steps 5]"""
import argparse
import os
import statistics
import threading
import time

import benchlib


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build-dir", default=os.path.join(benchlib.ROOT, "build"))
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    work = os.path.join(args.build_dir, "bench-pipeline-bubble")
    binary = os.path.join(work, f"sequential-m{args.microbatches}", "server_LmTrain")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    timed, neighbour = (benchlib.Contender(name, ["chrt", "-f", "1", "taskset", "-c", core, binary],
                                           env, os.path.join(work, "busy-neighbour"))
                        for name, core in (("timed", "0"), ("neighbour", "1")))
    if not (timed.start() and neighbour.start()):
        raise SystemExit(f"could not start {binary}: {timed.error or neighbour.error}")
    stop, busy = threading.Event(), threading.Event()

    def keep_stepping():
        while not stop.is_set():
            if busy.is_set():
                neighbour.measure(1)
            else:
                time.sleep(0.01)

    thread = threading.Thread(target=keep_stepping)
    thread.start()
    alone, beside = [], []
    for round_index in range(args.rounds):
        for samples, is_busy in ((alone, False), (beside, True)):
            busy.set() if is_busy else busy.clear()
            time.sleep(0.3)
            samples.append(timed.measure(args.steps)[0])
        print(f"round {round_index + 1}: core 1 idle {alone[-1]:.1f} ms, "
              f"core 1 busy {beside[-1]:.1f} ms", flush=True)
    stop.set()
    thread.join()
    timed.close()
    neighbour.close()
    idle_ms, busy_ms = statistics.median(alone), statistics.median(beside)
    print(f"median: core 1 idle {idle_ms:.1f} ms, core 1 busy {busy_ms:.1f} ms, "
          f"busy / idle {busy_ms / idle_ms:.3f}")


if __name__ == "__main__":
    main()
