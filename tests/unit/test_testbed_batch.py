"""Shell batches sent to Mininet nodes stay under the pty's line limit."""

import pytest

from emu.live import testbed


class FakeNode:
    name = "h1"

    def __init__(self, reply=""):
        self.lines = []
        self.reply = reply

    def cmd(self, line):
        self.lines.append(line)
        return self.reply


def test_long_batches_are_split_below_the_line_limit():
    node = FakeNode()
    commands = [f"ip neigh replace 10.0.0.{i} lladdr 02:fe:00:00:00:{i:02x} dev h1-eth1 "
                "nud permanent" for i in range(1, 128)]
    testbed._run_batch(node, commands, "install static ARP")
    assert len(node.lines) > 1
    assert all(len(line) <= testbed.MAX_COMMAND_LINE for line in node.lines)
    sent = [c for line in node.lines for c in line.split(" ; ")]
    assert sent == commands, "every command is sent once, in order"


def test_no_commands_sends_nothing_and_output_is_an_error():
    node = FakeNode()
    testbed._run_batch(node, [], "nothing")
    assert node.lines == []
    with pytest.raises(testbed.TestbedError, match="h1: could not set MTU: RTNETLINK"):
        testbed._run_batch(FakeNode("RTNETLINK answers: Invalid argument"), ["ip link"],
                           "set MTU")
