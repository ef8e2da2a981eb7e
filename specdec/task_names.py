"""The names under which specdec/tasks.py registers its seqio Tasks and Mixture.

Kept apart from tasks.py (which imports seqio and TensorFlow) so that code
that only names tasks, such as the result tables, imports neither.
"""

# Local tasks on the Debian DDTP corpora, and their Mixture.
ENDE_LOCAL_TASK = "specdec_ende_local"
SUMMARIZE_LOCAL_TASK = "specdec_summarize_local"
LOCAL_MIXTURE = "specdec_local_mix"
LOCAL_TASKS = (ENDE_LOCAL_TASK, SUMMARIZE_LOCAL_TASK)

# The paper's tasks (TFDS).
WMT_ENDE_TASK = "specdec_wmt_ende"
CNN_DAILYMAIL_TASK = "specdec_cnn_dailymail"
PAPER_TASKS = (WMT_ENDE_TASK, CNN_DAILYMAIL_TASK)
