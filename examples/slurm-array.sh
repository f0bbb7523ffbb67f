#!/bin/bash
# N shards of one run as a Slurm job array, one remote cache, one Redis; then the report from the remote
# cache (docs/distributed.md). Submit from the repository's root:
#
#   jid=$(sbatch --parsable examples/slurm-array.sh)
#   sbatch --dependency=afterany:$jid --wrap 'examples/slurm-array.sh report'
#
# To run one task again (it failed, or was cancelled), resubmit it into the same run:
#
#   DXI_RUN_ID=$jid sbatch --array=2 examples/slurm-array.sh
#
# It is still shard 2 of 8 (--shard auto/$SHARDS: a resubmitted task's SLURM_ARRAY_TASK_COUNT is 1), it
# shares the run's limits and cost bound in Redis (DXI_RUN_ID, else this job's id), and it finds its
# predecessor's local cache (the folder below is named by the run and the task, not the job), so it sends
# only what is missing. Every shard a task writes is uploaded under its own name, and `dxi report
# --cache-remote` reads them all from an empty folder.
#SBATCH --job-name=dxi-tonight
#SBATCH --array=0-7                # 8 shards, numbered from 0: --shard auto reads SLURM_ARRAY_TASK_ID
#SBATCH --cpus-per-task=2
#SBATCH --mem=2G
#SBATCH --time=12:00:00
#SBATCH --output=logs/dxi-%A_%a.log
set -euo pipefail

SHARDS=${DXI_SHARDS:-8}                         # the tasks of --array above (it survives resubmitting a task)
RUN_FILE=${DXI_RUN_FILE:-runs/tonight.toml}     # providers, models, prices (examples/run.toml)
REMOTE=${DXI_REMOTE:-s3://team-evals/dxi-cache} # or gs://bucket/prefix, or file:///shared/dxi-cache
REDIS=${DXI_REDIS:-redis://redis.internal:6379/0}  # limits and cost bound shared by the tasks
OUT=${DXI_OUT:-out/tonight}
DXI=${DXI:-.venv/bin/dxi}
# Credentials come from the environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE, an
# instance role; GOOGLE_APPLICATION_CREDENTIALS), never from the URI. An S3-compatible store (MinIO, Ceph):
# export AWS_ENDPOINT_URL_S3=https://minio.internal:9000
export DXI_RUN_ID=${DXI_RUN_ID:-${SLURM_ARRAY_JOB_ID:-report}}
# Each task's local cache: on a file system that outlives the job (not the job's $TMPDIR, which Slurm may
# empty when the job ends), named by the run and the task, so a requeued or resubmitted task, on this node
# or another that sees the same folder, recovers the replies its predecessor logged but had not uploaded.
CACHE=${DXI_CACHE_ROOT:-$HOME/.cache/dxi-slurm}/$DXI_RUN_ID/task-${SLURM_ARRAY_TASK_ID:-report}

if [[ "${1:-}" == "report" ]]; then             # after every shard: score and report from the remote cache
  exec "$DXI" report "$RUN_FILE" --cache-remote "$REMOTE" --cache-dir "$CACHE" --out "$OUT"
fi

# Exit codes: 0 done; 1 some requests failed (a rerun retries them); 3 the cost bound (shared by all tasks)
# was reached; 5 some shards could not be uploaded (a rerun of this task uploads them). Any of them: the
# task's replies are safe, and rerunning the array sends only what is missing.
"$DXI" run "$RUN_FILE" --shard "auto/$SHARDS" --cache-dir "$CACHE" --cache-remote "$REMOTE" \
  --coordinator "$REDIS" --max-cost "${DXI_MAX_COST:-200}" --out "$OUT/shard-$SLURM_ARRAY_TASK_ID"
