"""The LightningCLI shared by the recipes: RL-friendly trainer defaults, config files with per-recipe
sections and workflows by registered name (:mod:`drmas.config_files`), and the end-of-run summary
(:mod:`drmas.summary`)."""

from __future__ import annotations

import glob
import os
import sys
from typing import Any, Optional

# vLLM's worker runs inside each engine's own process (drmas.engines.vllm.process), not in one of
# vLLM's, and its CPU backend warns on every request. Set before anything imports vllm; the engine
# processes inherit it.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch.distributed as dist
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities.exceptions import SIGTERMException

import drmas.workflows.agents  # noqa: F401  (registers the built-in workflows)
import drmas.workflows.code  # noqa: F401
import drmas.workflows.debate  # noqa: F401
import drmas.workflows.games  # noqa: F401
import drmas.workflows.math  # noqa: F401
import drmas.workflows.search  # noqa: F401
from drmas.callbacks import GradNormSpikeMonitor, HFCheckpoint, IterationCheckpoint, RolloutStats
from drmas.callbacks.iteration_checkpoint import partial_path, recover_checkpoint
from drmas.checkout import config_args
from drmas.config_files import PARSER_MODE, active_recipe, resolve_argv_workflow, resolve_workflow
from drmas.console import quiet
from drmas.evaluation import evaluate, format_table
from drmas.data.datamodule import RolloutDataModule
from drmas.hardware import compute_device, default_precision, warn_if_slow_bf16
from drmas.modules.multi_agent import MultiAgentRL
from drmas.modules.policy import deferred_weights
from drmas.modules.preflight import PreflightError
from drmas.modules.sharding import check_resume, is_sharded, resolve_strategy
from drmas.ranks import GATHER_ENV, TIMEOUT_ENV
from drmas.summary import format_summary
from drmas.watch import watch

__all__ = ["ConfigurationError", "DrmasCLI", "exit_now", "format_summary", "run_recipe"]

#: What a configuration found wrong at start raises (an unknown name, values that cannot work
#: together, a missing file): the recipe prints it as one ``error:`` line and exits 2.
_CONFIG_ERRORS = (ValueError, KeyError, FileNotFoundError, ModuleNotFoundError)


class ConfigurationError(Exception):
    """A setting that cannot work, found before anything ran; ``run_recipe`` prints it as one
    ``error:`` line and exits 2 (the traceback with ``DRMAS_DEBUG=1``)."""


def _message(err: BaseException) -> str:
    # KeyError quotes its text
    return str(err.args[0] if isinstance(err, KeyError) and err.args else err).strip()


def _resolve_argv_configs(args: list[str]) -> list[str]:
    """``--config NAME``: a shipped config by name (:func:`drmas.checkout.config_args`)."""
    try:
        return config_args(args)
    except KeyError as err:
        raise ConfigurationError(err.args[0]) from None


class DrmasCLI(LightningCLI):
    """LightningCLI for ``MultiAgentRL`` + ``RolloutDataModule`` with a recipe's workflow as default."""

    def __init__(self, workflow: str, name: str, default_config: str | None = None, args: Any = None,
                 **kwargs: Any) -> None:
        self._workflow = resolve_workflow(workflow)
        if args is None:  # rewritten in place: LightningCLI warns when given args and argv both
            sys.argv[1:] = _resolve_argv_configs(resolve_argv_workflow(sys.argv[1:]))
        elif isinstance(args, (list, tuple)):
            args = _resolve_argv_configs(resolve_argv_workflow(list(args)))
        # The default config is read first; --config files and flags override it.
        fit: dict[str, Any] = {"parser_mode": PARSER_MODE}
        if default_config:
            fit["default_config_files"] = [default_config]
        active_recipe.append(name)
        try:
            super().__init__(
                MultiAgentRL,
                RolloutDataModule,
                trainer_defaults=trainer_defaults(name),
                save_config_kwargs={"overwrite": True},
                auto_configure_optimizers=False,  # each policy has its own AdamW (PolicyConfig.optim)
                parser_kwargs={"parser_mode": PARSER_MODE, "fit": fit, "validate": fit, "test": fit},
                args=args,
                **kwargs,
            )
        finally:
            active_recipe.pop()

    def add_arguments_to_parser(self, parser) -> None:
        parser.set_defaults({"data.workflow": {"class_path": self._workflow}})
        # Both checkpoint callbacks are configurable (`--checkpoint.every_n_iterations 10`, or 0 for
        # none): a policy of 8B parameters with its Adam state makes a ~100 GB Lightning checkpoint,
        # which a user may not want every iteration. By default: the full training state for
        # --ckpt_path resume at every iteration's end (written atomically).
        parser.add_lightning_class_args(HFCheckpoint, "hf_checkpoint")
        parser.add_lightning_class_args(IterationCheckpoint, "checkpoint")
        parser.add_argument(
            "--collective_timeout_s", type=Optional[float], default=None,
            help=("Seconds a rank waits for the others in a tensor collective (the process group's "
                  "timeout) before it stops, naming the wait and the rank that did not answer; default "
                  f"${TIMEOUT_ENV}, else 600 on GPUs and 300 on CPU (docs/reliability.md)."))
        parser.add_argument(
            "--gather_timeout_s", type=Optional[float], default=None,
            help=("Seconds a rank waits where the slowest rank's rollout can keep it: the object "
                  "gathers and agreements (a gloo group of their own) and each answer of its engine "
                  f"processes; default ${GATHER_ENV}, else 3600 on GPUs and 900 on CPU, never below "
                  "--collective_timeout_s."))
        parser.add_argument(
            "--print_memory_plan", type=Optional[str], default=None,
            help=("Print the memory plan this config would print at start on its GPUs, for the GPU named "
                  "(h100, h200, a100, a size in GiB, or cuda: this machine's), from the models' config.json "
                  "alone (no weights, no GPU needed), and exit: 0 when it fits, 2 when it does not "
                  "(docs/scaling.md)."))


    def instantiate_classes(self) -> None:
        device = self._get(self.config, "print_memory_plan")
        if device is not None:
            from drmas.modules.plan_preview import preview

            try:
                text, fits = preview(self.config.get(str(self.subcommand), self.config), device)
            except _CONFIG_ERRORS + (OSError,) as err:
                raise ConfigurationError(_message(err)) from err
            print(text, flush=True)
            sys.exit(0 if fits else 2)
        # fit with a sharded strategy: the policies are built on the meta device and each rank
        # reads only its shards once they are sharded (drmas.modules.policy.deferred_weights)
        sharded = (self.subcommand == "fit"
                   and is_sharded(self._get(self.config, "trainer", {}).get("strategy")))
        for key, env in (("collective_timeout_s", TIMEOUT_ENV), ("gather_timeout_s", GATHER_ENV)):
            timeout = self._get(self.config, key)
            if timeout is not None:  # read by the strategy and every wait (drmas.ranks)
                if not timeout > 0:
                    raise ConfigurationError(f"--{key} must be > 0, got {timeout}")
                os.environ[env] = repr(float(timeout))
        with deferred_weights(sharded):
            try:
                super().instantiate_classes()
            except _CONFIG_ERRORS as err:
                raise ConfigurationError(_message(err)) from err

    def before_fit(self) -> None:
        try:
            # the agents' policies checked now, not inside fit (the data module binds them again)
            self.datamodule.rollouts.bind(self.model)
            if self.datamodule.validation.swap_probe:
                self.datamodule.rollouts.swapped_agents()
            ckpt_path = self._get(self.config_init, "ckpt_path")
            if ckpt_path == "last":
                ckpt_path = self.config_init.get(str(self.subcommand),
                                                 self.config_init)["ckpt_path"] = self._find_last()
            check_resume(ckpt_path, self.trainer.strategy)
        except _CONFIG_ERRORS as err:
            raise ConfigurationError(_message(err)) from err

    def _run_subcommand(self, subcommand: str) -> None:
        try:
            super()._run_subcommand(subcommand)
        finally:
            # Lightning skips the module's teardown when fit stops on an exception (SIGTERM, an
            # engine failure); a vLLM engine left to the garbage collector is torn down by vLLM's
            # finaliser after the process group is gone, a traceback at exit
            self.model.close_engines()

    def _find_last(self) -> str | None:
        """``--ckpt_path last``: the newest ``last.ckpt`` of this run's checkpoint directory, or of
        any earlier version of this run's logs (each resumed run logs to a new version); None
        (a fresh start, said so) when there is none. The same command thus starts a job and
        resumes it after a preemption."""
        cb = self.trainer.checkpoint_callback
        logger = self.trainer.logger
        if cb is not None and cb.dirpath is not None:
            pattern = os.path.join(cb.dirpath, "last.ckpt")
        elif logger is not None and getattr(logger, "root_dir", None):
            pattern = os.path.join(logger.root_dir, "version_*", "checkpoints", "last.ckpt")
        else:
            pattern = os.path.join(self.trainer.default_root_dir, "checkpoints", "last.ckpt")
        # a whole checkpoint that a kill left before its swap is the newest: rank 0 moves it into
        # place, and every rank counts it (another rank may look before rank 0 has moved it)
        waiting = [os.path.join(os.path.dirname(p), "last.ckpt") for p in glob.glob(partial_path(pattern))]
        waiting = [p for p in waiting if recover_checkpoint(p, move=self.trainer.is_global_zero)]
        found = sorted(set(glob.glob(pattern)) | set(waiting),
                       key=lambda p: os.path.getmtime(p) if os.path.exists(p) else float("inf"))
        if self.trainer.is_global_zero:
            print(f"--ckpt_path last: resuming from {found[-1]}" if found
                  else f"--ckpt_path last: no checkpoint matches {pattern}; starting from the beginning",
                  flush=True)
        return found[-1] if found else None

    # ``validate`` and ``test`` play episodes (drmas.evaluation) instead of Lightning's loops
    def validate(self, model: MultiAgentRL, datamodule: RolloutDataModule, ckpt_path: str | None = None,
                 **_: Any) -> dict[str, float]:
        return self._evaluate("val", model, datamodule, ckpt_path)

    def test(self, model: MultiAgentRL, datamodule: RolloutDataModule, ckpt_path: str | None = None,
             **_: Any) -> dict[str, float]:
        return self._evaluate("test", model, datamodule, ckpt_path)

    def _evaluate(self, split: str, model: MultiAgentRL, datamodule: RolloutDataModule,
                  ckpt_path: str | None) -> dict[str, float]:
        if not datamodule.validation.tasks:
            raise ValueError("--data.validation.tasks is 0: there is nothing to evaluate")
        out_dir = self.trainer.log_dir or self.trainer.default_root_dir
        try:
            scalars = evaluate(model, datamodule, split, ckpt_path, out_dir)
        finally:
            model.teardown(split)
            datamodule.rollouts.workflow.close()
        print(format_table(scalars, datamodule.validation.k), flush=True)
        print(f"\nwritten: {os.path.join(out_dir, f'eval_{split}.json')} and eval_{split}.md", flush=True)
        return scalars

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list) -> Any:
        # drmas's strategy names (``fsdp``) before Lightning reads the string as one of its own
        config = {**config, "strategy": resolve_strategy(config.get("strategy", "auto"))}
        config["precision"] = resolve_precision(config.get("precision"),
                                                str(config.get("accelerator") or "auto"))
        config["plugins"] = cluster_plugins(config.get("plugins"))
        return super()._instantiate_trainer(config, callbacks)


def cluster_plugins(plugins: Any) -> Any:
    """Under SLURM, Lightning's SLURM environment without its requeue: its SIGUSR1 handler would save
    a checkpoint inside a signal handler (the ranks at different points: a collective mismatch) and
    write a non-atomic ``hpc_ckpt`` that Lightning then resumes from. drmas's own preemption path
    takes SIGTERM (``#SBATCH --signal=TERM@90``): every rank stops at the same point, resume with
    ``--ckpt_path last``. A SLURM environment the user gave is kept as given."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    given = [] if plugins is None else list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
    if SLURMEnvironment.detect() and not any(isinstance(p, SLURMEnvironment) for p in given):
        given.append(SLURMEnvironment(auto_requeue=False))
    return given or plugins


def resolve_precision(precision: Any, accelerator: str) -> Any:
    """An unset ``--trainer.precision`` follows the hardware (bf16 autocast where bf16 is native,
    fp32 elsewhere; see :mod:`drmas.hardware`); an explicit bf16 on a device that emulates it is
    kept, with a warning."""
    device = compute_device(accelerator)
    if precision is None:
        precision = default_precision(accelerator)
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            why = ("natively" if precision.startswith("bf16")
                   else "only by emulation, many times slower than fp32")
            print(f"precision: {precision} (this {device.upper()} computes bf16 {why}; "
                  "set --trainer.precision to choose)", flush=True)
    else:
        warn_if_slow_bf16("--trainer.precision", str(precision), device)
    return precision


def trainer_defaults(name: str) -> dict[str, Any]:
    # One Lightning epoch = one RL iteration; the rollout data is rebuilt every epoch; every scalar is
    # logged by the module with the iteration as step, so Lightning's own cadence is moot.
    return {
        "max_epochs": 4,
        "reload_dataloaders_every_n_epochs": 1,
        # each rank plans its own micro-batches; Lightning's sampler would split them again
        "use_distributed_sampler": False,
        "log_every_n_steps": 1,
        "num_sanity_val_steps": 0,
        "limit_val_batches": 0,
        "enable_progress_bar": False,
        "enable_model_summary": False,  # MultiAgentRL prints one line per policy instead
        "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                   # no `hp_metric = -1` placeholder as the first card a user sees
                   "init_args": {"save_dir": "runs", "name": name, "default_hp_metric": False}},
        "callbacks": [RolloutStats(), GradNormSpikeMonitor()],
    }


def run_recipe(workflow: str, name: str, default_config: str | None = None, args: Any = None) -> DrmasCLI:
    """Run a recipe's CLI (``workflow``: a registered name or an import path); after ``fit``,
    print where the logs are and the summary table."""
    argv = sys.argv if args is None else args
    if isinstance(argv, list) and "--verbose" in argv:
        argv.remove("--verbose")  # every third-party message too
    else:
        quiet()
    try:
        cli = DrmasCLI(workflow, name, default_config, args=args)
    except ConfigurationError as err:
        if os.environ.get("DRMAS_DEBUG", "0") not in ("", "0"):
            raise
        _leave_process_group()
        print(f"error: {err} (DRMAS_DEBUG=1 shows the traceback)", file=sys.stderr, flush=True)
        sys.exit(2)  # as jsonargparse exits for an unknown key
    except SIGTERMException:
        _leave_process_group()  # every rank stops at the same point (drmas.modules.preemption)
        # 128 + SIGTERM, as a process killed by it: a scheduler sees a preempted job, not a finished one
        sys.exit(143)
    except Exception as err:
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            watch.end(err)  # one line naming the failing rank and its error, on every rank; exit 1
        if not isinstance(err, PreflightError) or os.environ.get("DRMAS_DEBUG", "0") not in ("", "0"):
            raise
        # a failed first-minute pass names its step, rank and policy: that line is the whole story
        print(f"error: {err} (DRMAS_DEBUG=1 shows the traceback)", file=sys.stderr, flush=True)
        sys.exit(1)
    if getattr(cli, "subcommand", None) == "fit":
        summary = format_summary(cli.model, cli.trainer)  # on every rank: trainer.log_dir is a collective
        if cli.trainer.is_global_zero:
            print(summary, flush=True)
    cli.ranks_left = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    _leave_process_group()
    return cli


def exit_now(code: int = 0) -> None:
    """End a rank of a finished multi-rank run without the interpreter's teardown: its threads are
    joined and its exit handlers run (engines closed, logs flushed), then the process exits. In the
    teardown, torch's gloo process groups, still held by the policies' FSDP state, went down with
    their threads: a rank of a finished run was seen to abort there ("terminate called without an
    active exception", exit -6), which torchrun and schedulers read as a failed job (a restart)."""
    import atexit
    import threading

    threading._shutdown()  # type: ignore[attr-defined] - non-daemon threads joined, as at exit
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _leave_process_group() -> None:
    # Every rank leaves together, and the process group goes while the interpreter is whole: left
    # to the interpreter's exit, gloo's worker threads were seen to abort a finished run
    # ("terminate called without an active exception", exit -6).
    watch.stop()  # from here a rank that has finished may leave first
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
