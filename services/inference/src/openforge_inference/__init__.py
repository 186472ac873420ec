"""OpenForgeRL inference: token ids in, token ids and logprobs out."""
