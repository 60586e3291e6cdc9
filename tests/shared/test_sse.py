"""Reading Server-Sent Events as the HTML specification says."""
from corral.shared.sse import Message, Parser, messages


def test_events_split_anywhere_and_every_line_ending():
    stream = (b"retry: 2000\r\n\r\n: comment\nid: 1\nevent: job\ndata: {\"a\":\r\ndata: 1}\r\rid: 2\n"
              b": keep-alive\n\nid: 3\ndata: caf\xc3\xa9\n\n")
    for size in (1, 2, 3, 7, len(stream)):
        chunks = [stream[i:i + size] for i in range(0, len(stream), size)]
        parser = Parser()
        assert list(messages(chunks, parser)) == [Message("1", "job", '{"a":\n1}'), Message("3", "message", "café")]
        assert parser.last_id == "3"


def test_an_id_without_data_moves_the_position_only():
    parser = Parser("0")
    assert list(parser.feed("id: 7\n: keep-alive\n\n")) == []
    assert parser.last_id == "7"


def test_an_unfinished_event_is_not_given():
    parser = Parser()
    assert list(parser.feed("id: 1\ndata: x\n")) == []
    assert list(parser.feed("\n")) == [Message("1", "message", "x")]
