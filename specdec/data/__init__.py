"""The corpus builders: the local English→German and summarization corpora from Debian's package text, more
English→German pairs, the distillation pool and self-training corpora. The library reads their output through
`specdec.tasks`; nothing in the library imports them."""
