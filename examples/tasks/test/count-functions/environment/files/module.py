def a():
    pass


class K:
    def m(self):
        pass


def b(x):
    def inner():
        pass

    return x


async def c():
    pass
