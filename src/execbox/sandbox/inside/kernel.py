"""Inside the jail: a session's interpreter. It runs cells one at a time with IPython's
InteractiveShell, so the notebook semantics are IPython's own: the last expression's value is
shown, `display()` works, rich objects (pandas) render as text and HTML. Matplotlib figures a
cell leaves open come back as PNG, with their data as a chart (`charts`), and are closed.

Between cells SIGINT is ignored; during a cell it raises KeyboardInterrupt in the cell, which is
how the supervisor interrupts a cell past its time. After each cell the program flushes its
streams, writes the host's per-cell marker to stdout and stderr (so the host knows where the
cell's output ends) and sends a report frame to the supervisor.

This process runs the user's code: everything it reports is untrusted, and the supervisor and
host treat it so. Standard library and IPython only.
"""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import sys
from typing import Any, NoReturn

from . import charts, protocol, runner

HELLO, FAILED, CELL_REPORT, OUTPUT = b"HELO", b"FAIL", b"CRES", b"OUTP"
MIN_OUTPUT_BYTES = 1 << 20
MAX_OUTPUTS = 1000  # rich outputs per cell
MAX_MESSAGE = 16 * 1024


def outputs_cap(artifact_bytes: int) -> int:
    """Bytes of rich outputs one cell may return (the supervisor enforces it too)."""
    return max(MIN_OUTPUT_BYTES, artifact_bytes)


class _Outputs:
    """The rich outputs of the running cell, within a byte and a count budget."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.items: list[tuple[str, bytes]] = []
        self.used = 0
        self.truncated = False

    def reset(self) -> None:
        self.items, self.used, self.truncated = [], 0, False

    def add_bundle(self, bundle: dict[str, Any]) -> None:
        # text/plain first: the one every reader understands.
        for mime in sorted(bundle, key=lambda m: m != "text/plain"):
            self.add(mime, bundle[mime])

    def add(self, mime: str, value: Any) -> None:
        if isinstance(value, (bytes, bytearray)):
            data = base64.b64encode(value)
        elif isinstance(value, str):
            data = value.encode("utf-8", "replace")
        else:
            try:
                data = json.dumps(value, default=repr).encode("utf-8", "replace")
            except (TypeError, ValueError):
                data = repr(value).encode("utf-8", "replace")
        if self.used + len(data) > self.cap or len(self.items) >= MAX_OUTPUTS:
            self.truncated = True
            return
        self.used += len(data)
        self.items.append((str(mime)[:200], data))

    def send(self, report_w: int) -> None:
        """One frame per output: the MIME type, a NUL, the data."""
        for mime, data in self.items:
            protocol.send_all(report_w, protocol.frame(OUTPUT, mime.encode() + b"\0" + data))


def _make_shell(outputs: _Outputs) -> Any:
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    class CapturingHook(DisplayHook):  # type: ignore[misc]
        """The last expression's value becomes outputs, not an `Out[n]:` line on stdout."""

        def write_output_prompt(self) -> None:
            pass

        def write_format_data(
            self, format_dict: dict[str, Any], md_dict: dict[str, Any] | None = None
        ) -> None:
            outputs.add_bundle(format_dict)

        def finish_displayhook(self) -> None:
            self._is_active = False

    class CapturingPublisher(DisplayPublisher):  # type: ignore[misc]
        def publish(
            self,
            data: dict[str, Any],
            metadata: Any = None,
            source: Any = None,
            *,
            transient: Any = None,
            update: bool = False,
            **kwargs: Any,
        ) -> None:
            outputs.add_bundle(data)

    class Shell(InteractiveShell):  # type: ignore[misc]
        last_traceback_text = ""

        def _showtraceback(self, etype: Any, evalue: Any, stb: list[str]) -> None:
            # Tracebacks go to stderr, as a script's do, and into the cell's error.
            text = self.InteractiveTB.stb2text(stb)
            self.last_traceback_text = text
            try:
                sys.stderr.write(text + "\n")
                sys.stderr.flush()
            except Exception:  # noqa: BLE001 - the code may have closed stderr
                pass

    config = Config()
    config.HistoryManager.enabled = False  # no sqlite file, no saving thread
    config.InteractiveShell.colors = "nocolor"
    config.InteractiveShell.xmode = "Plain"
    config.InteractiveShell.autocall = 0
    return Shell.instance(
        config=config, displayhook_class=CapturingHook, display_pub_class=CapturingPublisher
    )


def _capture_figures(outputs: _Outputs) -> None:
    """Open matplotlib figures become image/png outputs, each followed by its data as a
    chart (when it has some), then are closed."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    try:
        for num in pyplot.get_fignums():
            _capture_figure(outputs, pyplot, num)
    finally:  # a figure that raised is not shown again by the next cell
        pyplot.close("all")


def _capture_figure(outputs: _Outputs, pyplot: Any, num: int) -> None:
    buf = io.BytesIO()
    figure = pyplot.figure(num)
    # The figure's methods are the cell's code: SystemExit from them must not end the session.
    try:
        figure.savefig(buf, format="png")
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a broken figure is the cell's problem
        outputs.add("text/plain", f"[figure {num} could not be rendered: {exc}]")
        return
    outputs.add("image/png", buf.getvalue())
    try:
        data = charts.chart(figure)
    except (Exception, SystemExit):  # noqa: BLE001 - a figure we cannot read still has its PNG
        data = None
    if data is not None:
        outputs.add(charts.MIME, data)


def _error_of(shell: Any, result: Any, filename_prefix: str) -> dict[str, Any] | None:
    exc = None if result is None else (result.error_before_exec or result.error_in_exec)
    if exc is None:
        return None
    line = column = None
    if isinstance(exc, SyntaxError):
        line, column = exc.lineno, exc.offset
    else:
        tb = exc.__traceback__
        while tb is not None:  # the deepest frame of code typed into the session
            if tb.tb_frame.f_code.co_filename.startswith(filename_prefix):
                line = tb.tb_lineno
            tb = tb.tb_next
    text = shell.last_traceback_text or f"{type(exc).__name__}: {runner.safe_str(exc)}"
    message = (
        getattr(exc, "msg", None) if isinstance(exc, SyntaxError) else None
    ) or runner.safe_str(exc)
    return {
        "type": type(exc).__name__,
        "message": message,
        "line": line,
        "column": column,
        "traceback": runner.keep_tail(text),
    }


def _end_streams(marker: bytes) -> dict[str, bool]:
    """Flush the cell's output and mark its end on both streams."""
    written = {}
    for name, stream, fd in (("stdout", sys.stdout, 1), ("stderr", sys.stderr, 2)):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - closed or replaced by the code
            pass
        try:
            protocol.send_all(fd, marker)
            written[name] = True
        except OSError:
            written[name] = False
    return written


def _leave_quietly() -> NoReturn:
    """End a forked copy of the interpreter without a report: the cell's answer is the
    interpreter's own, and a second loop would race it for the next cells."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - closed or replaced by the code
            pass
    os._exit(0)


def serve(go_r: int, report_w: int, src_paths: list[str], spec: dict[str, Any]) -> NoReturn:
    """Run cells until the supervisor closes the go pipe; never returns."""
    try:
        shell, outputs = _start(report_w, src_paths, spec)
    except BaseException as exc:  # noqa: BLE001 - say why, then end the session
        try:
            protocol.send_all(report_w, protocol.json_frame(FAILED, {"message": repr(exc)}))
        finally:
            os._exit(1)
    kernel_pid = os.getpid()
    try:
        while True:
            try:
                kind, payload = protocol.read_frame(go_r)
            except (EOFError, OSError):
                os._exit(0)
            cell = json.loads(payload)
            report = _run_cell(shell, outputs, cell["code"])
            if os.getpid() != kernel_pid:  # a cell's os.fork(): the copy's cell ends here
                _leave_quietly()
            report["cell"] = cell.get("cell")  # which cell this answers (see `cells`)
            report["markers"] = _end_streams(cell["marker"].encode())
            outputs.send(report_w)
            protocol.send_all(report_w, protocol.json_frame(CELL_REPORT, report))
    except BaseException:  # noqa: BLE001 - the code broke the loop itself: the session ends
        os._exit(1)


def _start(report_w: int, src_paths: list[str], spec: dict[str, Any]) -> tuple[Any, _Outputs]:
    runner.rebind_stdio()
    sys.argv = ["session"]
    sys.path[:] = [runner.WORKSPACE] + [p for p in sys.path if p not in src_paths]
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # IPython keeps a profile directory; it goes to /tmp, not into the workspace.
    os.environ["IPYTHONDIR"] = "/tmp/.ipython"
    outputs = _Outputs(outputs_cap(int(spec.get("artifact_bytes", 0))))
    shell = _make_shell(outputs)
    del os.environ["IPYTHONDIR"]
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:  # plt.show() shows the figure: it becomes an output now
        setattr(pyplot, "show", lambda *args, **kwargs: _capture_figures(outputs))  # noqa: B010
    protocol.send_all(report_w, protocol.json_frame(HELLO, {"pid": os.getpid()}))
    return shell, outputs


def _run_cell(shell: Any, outputs: _Outputs, code: str) -> dict[str, Any]:
    outputs.reset()
    shell.last_traceback_text = ""
    prefix = f"<ipython-input-{shell.execution_count}-"
    result = None
    interrupted = False
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            result = shell.run_cell(code, store_history=True)
        finally:
            # A pending SIGINT whose handler has not run yet is dropped once it is ignored.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    except KeyboardInterrupt:  # arrived outside the user's code, in IPython's own
        interrupted = True
    try:
        # Reading figures runs their code too: the cell's time still interrupts it.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            _capture_figures(outputs)
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Whatever a figure's code raised (KeyboardInterrupt, SystemExit) ends no session.
    except BaseException as exc:  # noqa: BLE001
        outputs.add("text/plain", f"[figures could not be captured: {exc!r}]")
    error = _error_of(shell, result, prefix)
    if interrupted and error is None:
        error = {
            "type": "KeyboardInterrupt",
            "message": "the cell was interrupted",
            "line": None,
            "column": None,
            "traceback": None,
        }
    if error is not None and len(error["message"]) > MAX_MESSAGE:
        error["message"] = error["message"][:MAX_MESSAGE] + runner.CUT_TAIL
    return {
        "status": "error" if error else "ok",
        "error": error,
        "outputs_truncated": outputs.truncated,
    }
