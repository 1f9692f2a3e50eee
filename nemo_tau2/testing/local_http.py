"""The threaded HTTP server behind the small scripted servers of tests (the NL judge, scheduled chats, proxies).

The standard library's ``ThreadingHTTPServer`` listens with a backlog of 5. tau2's pointwise reranker rates a
search's documents from a thread pool, and several tau2 reference runs may rate at once; on a loaded box the
accepting thread falls behind, connections past the backlog wait on SYN retransmits (1 s, 3 s, ...), and the
OpenAI client's 5 s connect timeout then fails them. tau2 drops a document whose rating failed without a word, so a
reference run scored a different search than ours (``test_banking_dense``'s reranker variant, in a full run of stop
61's session).
"""

from http.server import ThreadingHTTPServer


class LocalHTTPServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` on 127.0.0.1 with room for every connection a test's clients open at once."""

    request_queue_size = 1024
    daemon_threads = True  # a handler still running never holds up the test process's exit

    def __init__(self, handler, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), handler)
