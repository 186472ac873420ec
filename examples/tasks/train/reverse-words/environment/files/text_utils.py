def reverse_words(s):
    raise NotImplementedError
