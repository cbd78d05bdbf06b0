"""Metric names, defined once and used by the worker, the driver and the outputs.

Every worker sends one dict per measurement window, keyed by these names, to a Ray queue on
the driver's node (not ``ray.train.report``, which waits for the Train controller); the driver
aggregates the per-worker dicts.
"""

FLOPS_PER_PARAM_TOKEN = 6
"""Training FLOPs per parameter and token (2 forward + 4 backward), dense transformers."""

NONFINITE_RATE_MAX = 0.001
"""Share of optimizer steps skipped for non-finite gradients above which a run is unhealthy
(0.1%: a rare skip is the fp16 loss scaler finding its scale; more means the precision fails
the model): the training summary warns, the doctor flags."""

OPS = ("all_reduce", "all_gather", "reduce_scatter")
"""The collectives the bandwidth probe measures and the cost model prices."""

# Per-window metrics reported by every worker.
WINDOW = "window"
"""Index of the measurement window (0-based); warm-up steps are never reported."""
RANK = "rank"
WORLD_SIZE = "world_size"
NUM_STEPS = "num_steps"
"""Optimizer steps in this window."""
STEP_TIME_S = "step_time_s"
"""Median wall-clock of one optimizer step (all micro-steps) in the window; on GPU workers,
of its plain steps (one device sync each; ``train_fns.timing``)."""
DATA_S = "data_s"
"""Time per step waiting for the input batches to reach the device: they are built on the
host before the step's clock starts. The parts (data, fwd_bwd, optim, sync_micro) are those of
the window's median step on CPU workers, of its profiled step on GPU workers."""
FWD_BWD_S = "fwd_bwd_s"
"""Median time per step in forward+backward, gradient sync included where not hidden."""
OPTIM_S = "optim_s"
"""Median time per step in the optimizer (and scaler) step."""
SYNC_MICRO_S = "sync_micro_s"
"""Median forward+backward of the micro-step that syncs gradients (part of fwd_bwd_s)."""
NOSYNC_MICRO_S = "nosync_micro_s"
"""Forward+backward of a micro-step with gradient sync off: measured on the accumulation
micro-steps, or on one extra micro-step after the window when there is no accumulation."""
LOSS = "loss"
PEAK_MEM_BYTES = "peak_mem_bytes"
"""On GPU workers the larger of ``ALLOCATED_PEAK_BYTES`` and ``DEVICE_USED_PEAK_BYTES``; peak
process RSS on CPU workers."""
ALLOCATED_PEAK_BYTES = "allocated_peak_bytes"
"""torch's CUDA max allocated (tensors only); None on CPU workers."""
DEVICE_USED_PEAK_BYTES = "device_used_peak_bytes"
"""The GPU's used memory (total - free) at step ends, at its peak: NCCL's buffers and the CUDA
context included; None on CPU workers."""
MEMORY_CAPACITY_BYTES = "memory_capacity_bytes"
"""What the peak is compared with: the GPU's memory; on CPU the worker's cgroup memory limit,
or the machine's RAM where none is set (``train_fns.timing.memory_capacity_bytes``)."""
ENV_SEEN = "env_seen"
"""The tuned environment variables as the worker process really saw them (None: unset)."""
SETUP_S = "setup_s"
"""Worker-side set-up wall-clock by part: model build, wrap, first step (warm-up)."""
NUM_PARAMS = "num_params"
"""Trainable parameters of the whole (unwrapped) model: gradient bytes = this x 4 (fp32)."""
GPU_UTIL = "gpu_util"
"""NVML utilization (0-1) at the window's end on GPU workers; None on CPU or without NVML."""
WINDOW_WALL_S = "window_wall_s"
"""Wall-clock of the window's measured steps (what the search spends measuring)."""
GUARD = "guard"
"""First window only: the warm-up steps' global losses, gradient norms and updates, dropout
off (``train_fns.guard``), compared with the baseline's by the driver."""
MEAN_STEP_TIME_S = "mean_step_time_s"
"""The window's mean step time on this rank (its plain steps where it has some: on CUDA the
profiled step's syncs would weigh in); ``STEP_TIME_S`` is the median."""
GLOBAL_STEP_TIME_S = "global_step_time_s"
"""The slowest rank's median step time of the window (all-reduced: every rank has it)."""
NUM_NONFINITE = "num_nonfinite_steps"
"""Measured steps so far (cumulative, warm-up excluded) whose loss, or under fp16 loss
scaling whose gradients, were inf/NaN; the last window's value is the trial's total."""

# Per-step metrics of training runs (orchestrator.train).
STEP = "step"
"""Optimizer steps done so far, this one included (the counter never resets on resume)."""
ROWS = "rows"
"""A training report holds the per-step metrics of the steps since the previous report."""
EVENTS = "events"
"""What happened since the last report: start (world size, resumed from), resplit, no_split."""
ACCUMULATION_STEPS = "accumulation_steps"
MICRO_BATCH = "micro_batch"
GLOBAL_BATCH = "global_batch"
SAMPLES_SEEN = "samples_seen"
"""The data position: global samples consumed so far (the next step starts here)."""
EXPOSED_COMM_S = "exposed_comm_s"
"""Gradient sync not hidden behind compute: the syncing micro-step minus one without sync."""
COMPUTE_S = "compute_s"
"""Forward+backward of the step without the exposed communication."""
GRAD_NORM = "grad_norm"
LAYER_GRAD_NORMS = "layer_grad_norms"
LOSS_SCALE = "loss_scale"
LR = "lr"
WALL_TIME = "wall_time"
"""Worker wall clock (epoch seconds) when the step finished: recovery times are measured
against it."""
CHECKPOINT_STEP = "checkpoint_step"
"""Set on the reports that carry a checkpoint: the step it resumes at."""
SNAPSHOT_S = "snapshot_s"
"""Set on the steps that took an in-memory snapshot (``train_fns.snapshots``): its seconds."""
SNAPSHOT_HELD_BACK = "snapshot_held_back"
"""Set on the steps whose snapshot was not sent: the previous one was still on its way."""

# Trial-level metrics computed by the driver from the windows.
SAMPLES_PER_S = "samples_per_s"
"""Global samples/s: global_batch / median step time (median over windows)."""
MEAN_SAMPLES_PER_S = "mean_samples_per_s"
"""Global samples/s from the windows' mean steps (the slowest rank's; median over windows)."""
TOKENS_PER_S = "tokens_per_s"
COMM_FRACTION = "comm_fraction"
"""Exposed communication / (exposed communication + compute) of the step's fwd+bwd."""
THROUGHPUT_CV = "throughput_cv"
"""Coefficient of variation of the per-window throughput (stdev / mean)."""
STATE = "state"
REASON = "reason"
PLACE = "place"
"""A rank's first start message: where it runs (``node_id``, ``node_ip``, Ray's ``node_rank``
and ``local_rank``, and ``gpu_uuid``: its GPU, "" on a CPU worker)."""
PLACEMENT = "placement"
"""A trial's ranks per node, "node0:2,node1:2" (``orchestrator.cluster.placement.placement_label``):
trials whose placements differ do not compare."""
RANK_PLACES = "rank_places"
"""A trial's every rank's ``PLACE`` with its ``rank``, in rank order."""
GPUS = "gpus"
"""A trial's GPUs, each rank's UUID in rank order (``placement.gpu_uuids``; "" on CPU)."""
RANK_PIDS = "rank_pids"
"""The process id of each rank that measured a configuration (``{"0": pid, ...}``): the
configurations of one warm worker group share them, a fresh group's differ."""

# Trial states.
COMPLETE = "complete"
INFEASIBLE = "infeasible"
OOM = "oom"
HANG = "hang"
CRASH = "crash"
PRUNED = "pruned"
ERROR = "error"
CORRUPT = "corrupt"
"""It ran, but its losses or gradient norm left the baseline's beyond summation order."""

# Worker exit status.
HANG_EXIT_CODE = 75
"""Exit status of a worker its liveness watchdog ended: it finished no step within
``TrialPlan.step_deadline_s`` (a hang, e.g. a peer stuck in a collective)."""
WATCHDOG_PREFIX = "commtune watchdog:"
"""Start of the one stderr line the watchdog prints before ending a hung worker."""
STATE_FILE = "train_state.json"
HANG_MARKER_DIR = "hang-markers"
"""Where, inside a search group's trial folder, a hung worker's watchdog leaves its marker."""
HANG_MARKER = "hang-rank{rank}.txt"
"""A hung rank's marker file (``.format(rank=...)``; ``rank="*"`` globs them all)."""
"""A training checkpoint's state file; the driver reads it before Ray starts (here, not in
``train_fns.restart``, so that reading it does not import torch)."""
