"""The agent's park: its TCP watch refuses while a connection may be unsaveable."""

from __future__ import annotations

from podbay.agent import park

SNMP = "Tcp: ActiveOpens PassiveOpens CurrEstab\nTcp: {opens} 0 {estab}\n"


def watch_of(values: list[tuple[int, int]]) -> park.TcpWatch:
    texts = iter(SNMP.format(opens=o, estab=e) for o, e in values)
    last = [""]

    def read() -> str:
        last[0] = next(texts, last[0])
        return last[0]

    return park.TcpWatch(read)


def test_a_sandbox_that_never_connected_may_park() -> None:
    watch = watch_of([(0, 0), (0, 0)])
    watch.sample(now=1.0)
    assert watch.refusal(now=2.0) is None


def test_an_open_connection_refuses() -> None:
    watch = watch_of([(0, 0), (1, 1)])
    watch.sample(now=1.0)
    assert watch.refusal(now=500.0) == "1 TCP connection(s) open"


def test_a_closed_connection_refuses_until_its_time_wait_is_over() -> None:
    watch = watch_of([(0, 0), (1, 0), (1, 0), (1, 0)])
    watch.sample(now=0.0)
    watch.sample(now=10.0)  # opened (and closed) since: TIME_WAIT may hold it
    assert watch.refusal(now=20.0) is not None
    late = 10.0 + park.TIME_WAIT_SECONDS + park.SAMPLE_SECONDS + 1
    assert watch.refusal(now=late) is None


def test_connections_before_the_agent_started_count() -> None:
    watch = watch_of([(3, 0), (3, 0)])
    watch.sample(now=5.0)
    assert watch.refusal(now=6.0) is not None
