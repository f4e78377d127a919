"""The README's cluster example, run as written: a Redis, two `twistd msgbroker` nodes
joined to it with `--cluster`, a subscriber on the first, a publish on the second that the
subscriber prints. Only the ports change: Redis is this test's own (a free port, by
servers.py), the nodes listen on free ports, and the clients are pointed at them."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
from pathlib import Path

from tests.cluster.servers import RedisServer
from tests.ssmp.e2e_support import WAIT, LineReader, parse_address, stop_process, twistd_command
from tests.test_readme_tour import BIN, Subscriber, said

ROOT = Path(__file__).parents[2]


def example() -> list[str]:
    """The lines of the README's sh block that starts Redis for a cluster."""
    text = (ROOT / "README.md").read_text()
    for block in re.findall(r"```sh\n(.*?)```", text, re.DOTALL):
        if block.startswith("redis-server"):
            return block.splitlines()
    raise AssertionError("README.md has no cluster example")


def test_the_readme_cluster_example_publishes_across_nodes(
    redis: RedisServer, tmp_path: Path
) -> None:
    lines = example()
    commands = [shlex.split(line, comments=True) for line in lines]
    assert commands[0][:3] == ["redis-server", "--port", "6379"]  # the test's own instead
    nodes = [words for words in commands if words[0].endswith("twistd")]
    clients = [(words, line) for words, line in zip(commands, lines, strict=True)
               if words[0].endswith("/msgbroker")]
    assert len(nodes) == 2 and len(clients) == 2
    ports: dict[str, int] = {}
    with contextlib.ExitStack() as stack:
        for index, words in enumerate(nodes):
            assert words[1:3] == ["-n", "msgbroker"] and words[-1] == "&"
            options = words[3:-1]
            listen = options[options.index("--listen") + 1]
            assert options[options.index("--cluster") + 1] == "redis://127.0.0.1:6379"
            options[options.index("--listen") + 1] = "ssmp=tcp:0:interface=127.0.0.1"
            options[options.index("--cluster") + 1] = redis.url
            directory = tmp_path / f"node{index}"
            directory.mkdir()
            process = subprocess.Popen(
                twistd_command(*options), cwd=directory, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip
            stack.callback(stop_process, process, signal.SIGTERM)
            log = LineReader(process.stdout)
            ports[listen.rpartition(":")[2]] = parse_address(
                log.wait_for(r"ssmp listening on (\S+)").group(1)
            )[1]
            log.wait_for(r"cluster: node \S+ connected")
            if index == 1:  # the second node is known to the first: its interest will be
                log.wait_for(r"cluster: 1 other node\(s\)")
        (sub_words, sub_line), (pub_words, pub_line) = clients
        assert sub_words[1:3] == ["ssmp", "sub"] and sub_words[-1] == "&"
        sub_words = sub_words[:-1]
        said(sub_line.partition("#")[2], "on the first node")
        sub_port = sub_words[sub_words.index("--port") + 1]
        sub_words[sub_words.index("--port") + 1] = str(ports[sub_port])
        subscriber = Subscriber([str(BIN / "msgbroker"), *sub_words[1:]], dict(os.environ))
        stack.callback(stop_process, subscriber.process, signal.SIGINT)
        assert pub_words[1:3] == ["ssmp", "pub"]
        said(pub_line.partition("#")[2], "published on the second: printed")
        pub_port = pub_words[pub_words.index("--port") + 1]
        assert pub_port != sub_port  # another node
        pub_words[pub_words.index("--port") + 1] = str(ports[pub_port])
        # the first node's subscription reaches the second as an announcement, a moment
        # after the subscriber is told it is subscribed (a person typing the next command
        # never sees it): publish again until the subscriber prints, each time waiting on
        # its output
        topic, payload = pub_words[3], pub_words[4]
        printed = rf"^cli-\d+-[0-9a-f]+ {topic} {payload}$"
        for attempt in range(10):
            done = subprocess.run([str(BIN / "msgbroker"), *pub_words[1:]],
                                  capture_output=True, text=True, timeout=WAIT, check=False)
            assert done.returncode == 0, done.stderr
            try:
                subscriber.out.wait_for(printed, timeout=1.0 + attempt)
                break
            except AssertionError:
                continue
        else:
            raise AssertionError("the subscriber never printed what the other node published")
