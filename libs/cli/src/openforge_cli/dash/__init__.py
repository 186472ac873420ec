"""``openforge dash``: a local web page over the trajectory store's gRPC API.

:mod:`.views` turns the store's messages into the JSON the page reads, :mod:`.server` serves
that JSON and the static page (``static/``: HTML, JS, CSS; nothing is fetched from elsewhere).
"""
