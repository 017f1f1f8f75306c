"""Exit codes the learner and the job scripts around it agree on."""

REQUEUE_EXIT_CODE = 3
"""A learner rank that saved a checkpoint after the preemption notice exits with this code; the
job script (slurm/templates/job.sbatch) then runs `scontrol requeue` and the job starts again."""
