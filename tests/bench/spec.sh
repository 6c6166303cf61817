#!/usr/bin/env bash
# The speculative decoding section of make bench (issue 18), runnable on its
# own: plain and speculating runs of one engine, alternating (run.sh makes
# the checkpoint). Oracle drafts right 100/75/50/0 % of the time, prompt
# lookup on prompts that repeat themselves; the 0 % (off-switch) cases at
# 64 and 256 output tokens, batch 1 and 16 (batch 16 under the default
# draft row cap of 8: no drafts there). Without the cap:
#   spec --gen 64 --speculative oracle --spec-correct 100 --batch 16 --reps 3 --spec-max-rows 512
set -euo pipefail
BUILD=${BUILD:-build}
THREADS=${THREADS:-2}
cd "$(dirname "$0")/../.."
M06="$BUILD/models/qwen3-0.6b-bf16"
echo "# speculative decoding: $M06, $THREADS threads, prompt 128"
spec() { "$BUILD/redlm" bench-engine -m "$M06" --prompt 128 --threads "$THREADS" "$@"; }
# the off-switch first: what drafting costs when no draft is ever right;
# more pairs at 64 tokens, where a ~1 % effect sits under run-to-run noise
spec --gen 64 --speculative oracle --spec-correct 0 --batch 1 --reps 9
spec --gen 256 --speculative oracle --spec-correct 0 --batch 1 --reps 5
for c in 100 75 50; do
    spec --gen 64 --speculative oracle --spec-correct "$c" --batch 1 --reps 5
done
spec --gen 64 --speculative ngram --repeat --batch 1 --reps 5
spec --gen 64 --speculative oracle --spec-correct 0 --batch 16 --reps 5
spec --gen 64 --speculative oracle --spec-correct 100 --batch 16 --reps 5
spec --gen 256 --speculative oracle --spec-correct 0 --batch 16 --reps 3
