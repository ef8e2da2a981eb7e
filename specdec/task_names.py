"""The names under which specdec/tasks.py registers its seqio Tasks and Mixture, and what the local ones read.

Kept apart from tasks.py (which imports seqio and TensorFlow) so that code
that only names tasks, such as the result tables, imports neither; and apart
from corpora.py (which builds the local corpora), so that the tasks need
nothing of the corpus builder.
"""

# The T5 input prefixes, and the local corpora's folder names under the corpus directory.
TRANSLATE_PREFIX = "translate English to German: "
SUMMARIZE_PREFIX = "summarize: "
TRANSLATION_CORPUS = "translate_en_de"
SUMMARIZATION_CORPUS = "summarize_ddtp"
CORPORA = (TRANSLATION_CORPUS, SUMMARIZATION_CORPUS)

# Local tasks on the Debian DDTP corpora, and their Mixture.
ENDE_LOCAL_TASK = "specdec_ende_local"
SUMMARIZE_LOCAL_TASK = "specdec_summarize_local"
LOCAL_MIXTURE = "specdec_local_mix"
LOCAL_TASKS = (ENDE_LOCAL_TASK, SUMMARIZE_LOCAL_TASK)
# The local tasks by the short names the scripts take (--task ende), and the lengths the CPU family decodes them
# at (gin/tasks/*_local.gin binds the same).
LOCAL_TASK_BY_NAME = {"ende": ENDE_LOCAL_TASK, "summarize": SUMMARIZE_LOCAL_TASK}
LOCAL_FEATURE_LENGTHS = {"inputs": 96, "targets": 48}

# The paper's tasks (TFDS).
WMT_ENDE_TASK = "specdec_wmt_ende"
CNN_DAILYMAIL_TASK = "specdec_cnn_dailymail"
PAPER_TASKS = (WMT_ENDE_TASK, CNN_DAILYMAIL_TASK)
