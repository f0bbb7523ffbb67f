#!/bin/bash
# N shards of one run as a Slurm job array, one remote cache, one Redis; then the report from the remote
# cache (docs/distributed.md). Submit from the repository's root:
#
#   jid=$(sbatch --parsable examples/slurm-array.sh)
#   sbatch --dependency=afterany:$jid --wrap 'examples/slurm-array.sh report'
#
# Each task keeps its local cache on the node's own disk; every shard it writes is uploaded under its own
# name, and `dxi report --cache-remote` reads them all from an empty folder.
#SBATCH --job-name=dxi-tonight
#SBATCH --array=0-7                # 8 shards: --shard auto reads SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT
#SBATCH --cpus-per-task=2
#SBATCH --mem=2G
#SBATCH --time=12:00:00
#SBATCH --output=logs/dxi-%A_%a.log
set -euo pipefail

RUN_FILE=runs/tonight.toml                      # providers, models, prices (examples/run.toml)
REMOTE=s3://team-evals/dxi-cache                # or gs://bucket/prefix, or file:///shared/dxi-cache
REDIS=redis://redis.internal:6379/0             # limits and cost bound shared by the 8 tasks
# Credentials come from the environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE, an
# instance role; GOOGLE_APPLICATION_CREDENTIALS), never from the URI. An S3-compatible store (MinIO, Ceph):
# export AWS_ENDPOINT_URL_S3=https://minio.internal:9000
SCRATCH=${TMPDIR:-/tmp}/dxi-${SLURM_ARRAY_JOB_ID:-report}-${SLURM_ARRAY_TASK_ID:-0}

if [[ "${1:-}" == "report" ]]; then             # after every shard: score and report from the remote cache
  exec .venv/bin/dxi report "$RUN_FILE" --cache-remote "$REMOTE" --cache-dir "$SCRATCH/cache" --out out/tonight
fi

# Exit codes: 0 done; 1 some requests failed (a rerun retries them); 3 the cost bound (shared by all tasks)
# was reached; 5 some shards could not be uploaded (a rerun of this task uploads them). Any of them: the
# task's replies are safe, and rerunning the array sends only what is missing.
.venv/bin/dxi run "$RUN_FILE" --shard auto --cache-dir "$SCRATCH/cache" --cache-remote "$REMOTE" \
  --coordinator "$REDIS" --max-cost 200 --out "out/tonight/shard-$SLURM_ARRAY_TASK_ID"
