# SPDX-License-Identifier: BSD-3-Clause
# Run by busybox sh in the Soft-RoCE guest (scripts/rdma-guest --run), with rxe0 on lo. run-tests'
# rdma stage writes the release build's path in place of @BUILD@ (the binaries sit at the same paths
# in the guest), and in place of @BENCH@ 1 when the benchmark rounds against perftest are asked for
# (CHORUS_RDMA_BENCH=1), else 0: CI runs the tests and the checked all_reduce sweeps only. Everything runs serially: rxe drops completions under heavy concurrency.
# Sections start with "CHORUS-SECTION <name>" lines (scripts/rdma-guest.d/summary.py reads them);
# the exit status is non-zero when any test or benchmark failed.
B=@BUILD@
BENCH=@BENCH@
status=0
script_from=$(date +%s)
section() { echo "CHORUS-SECTION $*"; }
run() {
  "$@" || { echo "CHORUS-FAILED ($?): $*"; status=1; }
}

# The rdma transport's tests on the real device (no fake: CHORUS_TEST_RDMA_REAL=1), the collective
# matrix at 2 and 3 ranks among them, and a shrink after a kill; the fault injections need the fake
# and stay out.
section "rdma transport tests"
run env CHORUS_TEST_RDMA_REAL=1 "$B/tests/rdma/rdma_tests" --no-intro \
  -tc='rdma: messages*,rdma: many*,rdma: large*,rdma: a receive*,rdma: transport=*,rdma: every collective dtype and op at world 2,rdma: every collective dtype and op at world 3,rdma: the survivors*'

# perftest: a server in the background, the client against it; the client retries while the
# server is not listening yet (bounded). A pair that fails once it ran (under emulation perftest's
# clock calibration can fail: "Correlation coefficient r^2 < 0.9 / Can't produce a report") runs
# again on another port, three times at most. perftest is the reference, not what is tested: a
# figure it never gives is reported missing by summary.py, and does not fail the run.
perftest() {  # perftest <tool> <port> <args...>
  tool=$1 port=$2
  shift 2
  for attempt in 1 2 3; do
    "$tool" -d rxe0 -x 1 -p "$port" "$@" > "/tmp/$tool-$port.server" 2>&1 &
    server=$!
    tries=0 ok=0
    while [ $tries -lt 20 ]; do
      if "$tool" -d rxe0 -x 1 -p "$port" "$@" 127.0.0.1; then ok=1; break; fi
      kill -0 $server 2>/dev/null || break  # the server is gone: the run took place and failed
      tries=$((tries + 1))
      sleep 0.5
    done
    kill $server 2>/dev/null
    wait $server 2>/dev/null
    [ $ok = 1 ] && return 0
    echo "CHORUS-PERFTEST-RETRY: $tool $* on port $port failed (attempt $attempt of 3)"
    port=$((port + 1000))
  done
  echo "CHORUS-PERFTEST-MISSING: $tool $* failed three times"
}
# Three rounds, each chorus then perftest on the same device (summary.py takes the medians: one
# run under emulation can stall). Bandwidth: sendrecv_perf (nccl-tests' default: back-to-back
# calls) at 1 and 16 MiB against ib_write_bw, as it is (each message's buffer registered for it)
# and with -R 1 (the buffers registered once, chorus::RegisteredMemory, as perftest registers
# its own). Latency at 8 B: tcp_pingpong's ping-pong (half round trip, the pattern of
# ib_write_lat and ib_send_lat) and sendrecv_perf with blocking calls (-z 2: one exchange per
# iteration, both ranks sending at once), and verbs_floor (scripts/rdma-guest.d/verbs_floor.c):
# what raw verbs with busy polling take for ib_write_lat's ping-pong and for that exchange.
# A round takes about a minute under emulation on this kind of machine, and up to three on a slow
# day; the guest's whole run has run-tests' --timeout (450 s, boot included). So a round after
# the first starts only while the rounds so far leave room for one more like them before
# ROUNDS_BUDGET seconds from the start of this script; the rounds it leaves out are named, and
# summary.py takes the medians of the rounds that ran. The sweeps below run in any case.
ROUNDS_BUDGET=300
rounds_from=$(date +%s)
rounds="1 2 3"
if [ "$BENCH" != 1 ]; then
  echo "CHORUS-ROUNDS-SKIPPED: the benchmark rounds are opt-in (CHORUS_RDMA_BENCH=1)"
  rounds=""
fi
for round in $rounds; do
  if [ "$round" -gt 1 ]; then
    now=$(date +%s)
    per_round=$(((now - rounds_from) / (round - 1)))
    if [ $((now - script_from + per_round)) -gt $ROUNDS_BUDGET ]; then
      echo "CHORUS-ROUNDS-SKIPPED: rounds $round to 3 left out: $((now - script_from)) s so far, $per_round s a round, budget $ROUNDS_BUDGET s"
      break
    fi
  fi
  section "sendrecv_perf rdma 2 round $round"
  run "$B/bench/coll/sendrecv_perf" -b 1M -e 16M -f 16 -n 20 -w 5 --nranks 2 --transport rdma
  section "sendrecv_perf rdma 2 registered round $round"
  run "$B/bench/coll/sendrecv_perf" -b 1M -e 16M -f 16 -n 20 -w 5 --nranks 2 --transport rdma -R 1
  section "ib_write_bw 1048576 round $round"
  perftest ib_write_bw $((18600 + 10 * round)) --report_gbits -s 1048576 -n 200
  section "ib_write_bw 16777216 round $round"
  perftest ib_write_bw $((18601 + 10 * round)) --report_gbits -s 16777216 -n 20
  # Both directions at once, as sendrecv_perf moves them (perftest reports the sum of the two).
  section "ib_write_bw bidir 1048576 round $round"
  perftest ib_write_bw $((18604 + 10 * round)) -b --report_gbits -s 1048576 -n 100
  section "ib_write_bw bidir 16777216 round $round"
  perftest ib_write_bw $((18605 + 10 * round)) -b --report_gbits -s 16777216 -n 10
  section "pingpong rdma round $round"
  run "$B/bench/p2p/tcp_pingpong" --transport rdma --sizes 8 --bw-sizes 1M --iters 1000 --repeats 1
  section "sendrecv_perf rdma 2 blocking 8 round $round"
  run "$B/bench/coll/sendrecv_perf" -b 8 -e 8 -n 1000 -w 100 -z 2 --nranks 2 --transport rdma
  section "ib_write_lat 8 round $round"
  perftest ib_write_lat $((18602 + 10 * round)) -s 8 -n 1000
  section "ib_send_lat 8 round $round"
  perftest ib_send_lat $((18603 + 10 * round)) -s 8 -n 1000
  # The device's own floor for the same patterns: raw verbs, busy polling, no library.
  section "verbs_floor round $round"
  "$B/verbs_floor" -d rxe0 -x 1 -p $((18606 + 10 * round)) -n 1000 -r 3 > /tmp/verbs_floor.server 2>&1 &
  vf=$!
  run "$B/verbs_floor" -d rxe0 -x 1 -p $((18606 + 10 * round)) -n 1000 -r 3 127.0.0.1
  wait $vf || { echo "CHORUS-FAILED: verbs_floor server"; cat /tmp/verbs_floor.server; status=1; }
done

# all_reduce's whole sweep once at 2 and 3 ranks, every result checked, for the record.
section "all_reduce_perf rdma 2"
run "$B/bench/coll/all_reduce_perf" -b 8 -e 16M -f 4 -n 10 -w 3 --nranks 2 --transport rdma
section "all_reduce_perf rdma 3"
run "$B/bench/coll/all_reduce_perf" -b 8 -e 16M -f 4 -n 10 -w 3 --nranks 3 --transport rdma
section "end"
exit $status
