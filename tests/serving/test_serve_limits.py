"""`bertkit serve` never answers 500 to a client's input (issue 30): limits checked on the bytes
before parsing, each handler's bad input a 4xx with TEI's error body, a 5xx only for a fault of the
server (logged with its traceback), and a bad --host or a port in use one `error:` line, exit 2."""

import io
import json
import logging
import socket

import pytest
from http_server import request, server_in_thread

from bertkit.cli import main
from bertkit.heads import BertForQuestionAnswering
from bertkit.inference import InferenceEngine
from bertkit.model import BertModel
from bertkit.serving.command import Server
from bertkit.serving.access_log import AccessLog
from bertkit.serving.requests import RequestError, nesting_depth, parse_json_object


def test_nesting_depth_ignores_brackets_in_strings():
    assert nesting_depth(b'{"a": [[1], {"b": "[[[[{{{"}]}') == 3
    assert nesting_depth(b'["\\"[[[", [[]]]') == 3
    assert nesting_depth(b"[" * 200_000) == 200_000


def test_many_brackets_inside_strings_or_at_the_limit_still_parse():
    # More than 128 opening brackets, but inside a string: the bracket count alone must not refuse it.
    assert parse_json_object(b'{"inputs": "' + b"[{" * 300 + b'"}') == {"inputs": "[{" * 300}
    deepest_allowed = b'{"inputs": ' + b"[" * 127 + b"]" * 127 + b"}"
    assert nesting_depth(deepest_allowed) == 128 and "inputs" in parse_json_object(deepest_allowed)


@pytest.mark.parametrize("body, status, fragment", [
    (b"[" * 200_000, 422, "nests 200000 levels deep, more than the limit of 128"),
    (b'{"inputs": ' + b"[" * 128 + b"]" * 128 + b"}", 422, "nests 129 levels"),
    (b'{"inputs": "\\ud800"}', 400, "half of a surrogate pair"),
    (b'{"inputs": NaN}', 400, "NaN is not JSON"),
    (b'{"top_k": 1' + b"0" * 5000 + b"}", 400, "not valid JSON"),
])
def test_bodies_that_break_python_parsers_are_refused_before_parsing(body, status, fragment):
    with pytest.raises(RequestError) as refused:
        parse_json_object(body)
    assert refused.value.status == status and fragment in refused.value.message


@pytest.fixture(scope="module")
def qa_port(tmp_path_factory, tiny_model):
    folder = tiny_model(BertForQuestionAnswering, tmp_path_factory.mktemp("qa_limits"), max_positions=64)
    server = Server(InferenceEngine(folder, precision="fp32"))
    server.access_log.stream = io.StringIO()
    with server_in_thread(server) as port:
        yield port


@pytest.mark.parametrize("body, fragment", [
    ({"inputs": {"question": "who?", "context": "\x00\x01\x02\x03\x04"}}, "the context has no tokens"),
    ({"inputs": {"question": "who?", "context": "Rex and a cat"}, "max_answer_len": 0}, "'max_answer_len' must be at least 1"),
    ({"inputs": {"question": "who?", "context": "Rex and a cat"}, "top_k": 0}, "'top_k' must be at least 1"),
    ({"inputs": {"question": "who?", "context": "Rex"}, "top_k": True}, "'top_k' must be int"),
])
def test_question_answering_bad_input_is_422(qa_port, body, fragment):
    status, answer = request(qa_port, "/question-answering", body)
    assert status == 422 and fragment in answer["error"] and set(answer) == {"error", "error_type"}


def test_question_answering_extreme_but_valid_numbers_answer(qa_port):
    item = {"question": "who?", "context": "Rex and a cat sat on the mat"}
    status, answers = request(qa_port, "/question-answering", {"inputs": item, "top_k": 10**30, "max_answer_len": 10**30})
    assert status == 200 and answers and all(0 <= a["start"] <= a["end"] <= len(item["context"]) for a in answers)
    assert request(qa_port, "/question-answering", raw=b"[" * 200_000)[0] == 422
    assert request(qa_port, "/health")[0] == 200


def test_a_server_fault_is_500_logged_with_its_traceback(tmp_path, tiny_model, caplog):
    folder = tiny_model(BertModel, tmp_path / "encoder", max_positions=64)
    server = Server(InferenceEngine(folder, precision="fp32"))
    server.access_log.stream = log = io.StringIO()

    def broken_pool(*args, **kwargs):
        raise RuntimeError("simulated fault in pooling")

    server.engine.pool = broken_pool
    with caplog.at_level(logging.ERROR, logger="bertkit"), server_in_thread(server) as port:
        status, answer = request(port, "/embed", {"inputs": "hello"})
        assert status == 500 and answer == {"error": "internal server error (logged on the server)",
                                            "error_type": "backend"}
        assert request(port, "/embed", {"inputs": 5})[0] == 422  # client errors stay 4xx
        assert request(port, "/health")[0] == 200
    fault = next(r for r in caplog.records if "POST /embed failed" in r.getMessage())
    assert fault.exc_info and "simulated fault in pooling" in str(fault.exc_info[1])
    assert "status=500" in log.getvalue()


def test_json_log_format_writes_faults_with_their_traceback():
    stream = io.StringIO()
    handler = AccessLog("json", stream).handler()
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("bertkit", logging.ERROR, __file__, 1, "POST /embed failed", None,
                                   exc_info=__import__("sys").exc_info())
    handler.emit(record)
    entry = json.loads(stream.getvalue())
    assert entry["level"] == "error" and entry["message"] == "POST /embed failed"
    assert "Traceback" in entry["traceback"] and "ValueError: boom" in entry["traceback"]


def run_cli_stderr(argv, capsys) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("error: "), err
    return code, err


def test_bad_host_or_port_in_use_is_one_error_line_exit_2(tiny_model_dir, capsys):
    code, err = run_cli_stderr(["serve", "--model", tiny_model_dir, "--host", "256.1.1.1"], capsys)
    assert code == 2 and "--host '256.1.1.1' is not an address" in err
    code, err = run_cli_stderr(["serve", "--model", tiny_model_dir, "--port", "70000"], capsys)
    assert code == 2 and "--port must be between 0 and 65535" in err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = run_cli_stderr(["serve", "--model", tiny_model_dir, "--port", port], capsys)
    assert code == 2 and f"cannot listen on 127.0.0.1:{port}: the port is in use" in err


def test_a_client_that_disconnects_mid_body_is_one_log_line_499(tmp_path, tiny_model, caplog):
    import time

    folder = tiny_model(BertModel, tmp_path / "encoder", max_positions=64)
    server = Server(InferenceEngine(folder, precision="fp32"))
    server.access_log.stream = log = io.StringIO()
    with caplog.at_level(logging.WARNING), server_in_thread(server) as port:
        for _ in range(2):  # each client that leaves is its own line
            with socket.create_connection(("127.0.0.1", port)) as client:
                client.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                               b"Content-Length: 1000\r\n\r\n" + b'{"inputs": "hel')  # 15 of 1,000 bytes
            deadline = time.monotonic() + 10
            while log.getvalue().count("route=/embed") < _ + 1 and time.monotonic() < deadline:
                time.sleep(0.05)
        assert request(port, "/embed", {"inputs": "hello"})[0] == 200  # the server goes on
    lines = [line for line in log.getvalue().splitlines() if "route=/embed" in line]
    assert len(lines) == 3 and all("status=499" in line for line in lines[:2]) and "status=200" in lines[2]
    assert "Traceback" not in log.getvalue() and not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert 'bertkit_requests_total{route="/embed",status="499"} 2' in server.metrics.text()
