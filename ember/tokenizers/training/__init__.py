"""Training tokenizers from text: byte-level BPE and Unigram LM (`ember tokenizers train`)."""
