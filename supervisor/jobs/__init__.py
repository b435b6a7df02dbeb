"""Jobs: their states (:mod:`.states`, the transition table), the record and its view
(:mod:`.record`), the queue in run order (:mod:`.queue`), the engine's table of jobs
(:mod:`.table`), and the questions the faces ask about them (:mod:`.query`)."""

from .record import Job, JobView, advance_seq, new_job_id, next_seq
from .states import ACTIVE, FINISHED, IllegalTransition, JobState

__all__ = ["ACTIVE", "FINISHED", "IllegalTransition", "Job", "JobState", "JobView",
           "advance_seq", "new_job_id", "next_seq"]
