"""The trainers: the gin-configured T5 trainer (`python -m specdec.training.train`) and its configuration, the
feature-head trainer, and the divergences drafters are distilled with. They use the library; nothing in the library
imports them."""
