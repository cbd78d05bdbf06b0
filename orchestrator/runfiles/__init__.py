"""The run folder, in one place: which files a run holds, what run_info.json, summary.json and
remeasure.csv record, and the record the doctor and the report read.

Every command that writes or reads a run folder goes through here, so a file's name, a
run_info or summary key and how each is read are decided once (a test holds every other module
to it): ``files`` names the files and reads and writes them (whole files atomically),
``info`` is run_info.json, ``summary`` summary.json and ``remeasure`` remeasure.csv's rows as
typed records (a value of the wrong kind reads as absent), ``record`` is a whole folder read
once.
"""

from orchestrator.runfiles.board import Board
from orchestrator.runfiles.files import (
    BEST_ENV,
    BEST_YAML,
    EVENTS_JSONL,
    GRAD_NORMS_CSV,
    KNOWN_FILES,
    LAST_STEP,
    PROBE_CSV,
    PROBE_DIR,
    PROGRESS_CSV,
    REMEASURE_CSV,
    REPORT_HTML,
    RUN_INFO,
    SEARCH_FILES,
    STUDY_DB,
    STUDY_JOURNAL,
    SUMMARY_JSON,
    TENSORBOARD_DIR,
    TRAIN_DIR,
    TRAIN_FILES,
    TRAIN_RUN_NAME,
    TRIALS_CSV,
    TRIALS_DIR,
    TUNER_CONF,
    WRITTEN_FILES,
    missing_dirs,
    read_csv,
    read_mapping,
    read_probe,
    run_files,
    storage_dir,
    topology,
    write_atomic,
    write_csv,
)
from orchestrator.runfiles.info import RunInfo, add_search_wall, read_run_info, update_run_info
from orchestrator.runfiles.record import BELOW_SEARCHED, RunRecord, below_searched, collect, num
from orchestrator.runfiles.summary import Summary, write_summary

__all__ = [
    "BEST_ENV",
    "BEST_YAML",
    "EVENTS_JSONL",
    "GRAD_NORMS_CSV",
    "KNOWN_FILES",
    "LAST_STEP",
    "PROBE_CSV",
    "PROBE_DIR",
    "PROGRESS_CSV",
    "REMEASURE_CSV",
    "REPORT_HTML",
    "RUN_INFO",
    "SEARCH_FILES",
    "STUDY_DB",
    "STUDY_JOURNAL",
    "SUMMARY_JSON",
    "TENSORBOARD_DIR",
    "TRAIN_DIR",
    "TRAIN_FILES",
    "TRAIN_RUN_NAME",
    "TRIALS_CSV",
    "TRIALS_DIR",
    "TUNER_CONF",
    "WRITTEN_FILES",
    "Board",
    "RunInfo",
    "RunRecord",
    "Summary",
    "BELOW_SEARCHED",
    "below_searched",
    "add_search_wall",
    "collect",
    "missing_dirs",
    "num",
    "read_csv",
    "read_mapping",
    "read_probe",
    "read_run_info",
    "run_files",
    "storage_dir",
    "topology",
    "update_run_info",
    "write_atomic",
    "write_csv",
    "write_summary",
]
