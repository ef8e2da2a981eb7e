"""Compiles, never runs, the programs docs/cloud_tpu.md launches, with XLA's TPU compiler on this machine.

  python scripts/tpu_compile.py --slice=v4-8 --kinds=decode,baseline,verify,draft_step   # the Table-2 rows
  python scripts/tpu_compile.py --slice=v4-128 --kinds=train_step                        # the eight fine-tunes
  python scripts/tpu_compile.py --compare_plans        # planned vs compiled GiB per chip, from the jsons

Writes results/tpu_compile/<slice>.json and .md (per program and chip: memory against HBM, compile seconds,
collectives, FLOPs and bytes of the straight-line programs), rewritten atomically after each program; a rerun
skips the programs already there (--retry_failed compiles the failed ones again). Needs libtpu:
`pip install 'jax[tpu]==<jax version>'`; no TPU.
"""

import argparse
import os
import platform
import sys

# No TPU here: jax keeps to the CPU at start-up; libtpu still compiles for the topology.
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
DEFAULT_OUT = 'results/tpu_compile'


def parse_args(argv):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--slice', default='v4-8', help='a Cloud TPU slice: v4-8 ... v4-128, v5litepod-N / v5e-N, '
                      'v5p-N, v6e-N')
  parser.add_argument('--kinds', default='decode,baseline,verify,draft_step',
                      help='comma list of decode, baseline, verify, draft_step, train_step')
  parser.add_argument('--only', default='', help='comma list of gin file names (without .gin) to compile')
  parser.add_argument('--num_partitions', type=int, default=None,
                      help='override the gin files\' NUM_PARTITIONS (the mesh\'s model axis)')
  parser.add_argument('--batch_size', type=int, default=None,
                      help='override the Table-2 rows\' batch size (settings.Setting.batch_size)')
  parser.add_argument('--out', default=DEFAULT_OUT, help='results directory (relative to the repo)')
  parser.add_argument('--retry_failed', action='store_true', help='compile again the programs that failed')
  parser.add_argument('--verify_curve', action='store_true',
                      help='compile the XXL target\'s k-token steps (k = 1..16, batch 1 and 8) and the drafters\' '
                      'steps, and predict (not measure) the Table-2 speedups from them: <slice>_verify_curve_*')
  parser.add_argument('--measured_curve', nargs='?', const='auto', default=None,
                      help='only write <slice>_verify_curve_measured.md: Table 2 from the verify-cost curve and '
                      'costs that scripts/accelerator_check.py measured on a TPU (its report.json; by default the '
                      'newest TPU report under results/accelerator/), beside the compiled prediction')
  parser.add_argument('--compare_plans', action='store_true',
                      help='only write the planned-vs-compiled table from the jsons already in --out')
  return parser.parse_args(argv)


def _command(argv) -> str:
  return ' '.join(['python scripts/tpu_compile.py', *argv])


def _write_measured_curve(slice_name: str, out_dir: str, report: str):
  """<slice>_verify_curve_measured.md from `report` ('auto': the newest TPU report), or None if there is none."""
  from specdec.cloud_tpu import tpu_verify_curve  # pylint: disable=g-import-not-at-top
  path = tpu_verify_curve.find_measured_report(REPO) if report == 'auto' else os.path.join(REPO, report)
  if not path:
    return None
  if not os.path.exists(path):
    raise SystemExit(f'tpu_compile: no accelerator report at {report}.')
  md_path = os.path.join(out_dir, f'{slice_name}_verify_curve_measured.md')
  try:
    tpu_verify_curve.write_measured_markdown(path, md_path, os.path.join(out_dir, f'{slice_name}_verify_curve.json'),
                                             REPO)
  except ValueError as e:
    raise SystemExit(f'tpu_compile: {e}') from None
  return md_path


def main(argv=None):
  argv = list(sys.argv[1:] if argv is None else argv)
  args = parse_args(argv)
  out_dir = os.path.join(REPO, args.out)
  if args.compare_plans:
    from specdec.cloud_tpu import tpu_plan_check  # pylint: disable=g-import-not-at-top
    path = tpu_plan_check.write_comparison(REPO, out_dir, _command(argv))
    print(f'Wrote {os.path.relpath(path, REPO)}')
    return
  if args.measured_curve is not None:
    path = _write_measured_curve(args.slice, out_dir, args.measured_curve)
    if path is None:
      raise SystemExit('tpu_compile: no accelerator report measured on a TPU with the XXL target\'s curve under '
                       'results/accelerator/ (run scripts/accelerator_check.py on a TPU, or name its report.json).')
    print(f'Wrote {os.path.relpath(path, REPO)}')
    return
  from specdec.cloud_tpu import tpu_compile  # pylint: disable=g-import-not-at-top
  from specdec.cloud_tpu import tpu_programs  # pylint: disable=g-import-not-at-top
  from specdec.cloud_tpu import tpu_slices  # pylint: disable=g-import-not-at-top
  kinds = [k for k in args.kinds.split(',') if k]
  try:
    tpu = tpu_slices.slice_named(args.slice)
    unknown = [k for k in kinds if k not in tpu_programs.KINDS]
    if unknown:
      raise ValueError(f'unknown kinds {unknown}; known: {", ".join(tpu_programs.KINDS)}.')
    tpu_slices.check_libtpu()
    devices = tpu_slices.topology_devices(tpu)
    if args.num_partitions is not None:
      problem = tpu_slices.mesh_problem(tpu, args.num_partitions, devices)
      if problem:
        raise ValueError(problem + '.')
  except (ValueError, RuntimeError) as e:
    raise SystemExit(f'tpu_compile: {e}') from None

  import jax  # pylint: disable=g-import-not-at-top
  mesh_of = lambda num_partitions: tpu_slices.slice_mesh(tpu, num_partitions, devices)
  bindings = []
  if args.num_partitions is not None:
    bindings.append(f'--gin.NUM_PARTITIONS={args.num_partitions}')
  only = {name for name in args.only.split(',') if name}
  pick = lambda files: [f for f in files if not only or os.path.splitext(os.path.basename(f))[0] in only]
  decode_bindings = list(bindings)
  if args.batch_size is not None:
    decode_bindings.append(f'--gin.settings.Setting.batch_size={args.batch_size}')

  def programs():
    decode_kinds = [k for k in kinds if k != 'train_step']
    if decode_kinds:
      yield from tpu_programs.launched_programs(mesh_of, decode_kinds, pick(tpu_programs.table2_gin_files()),
                                                [], decode_bindings)
    if 'train_step' in kinds:
      yield from tpu_programs.launched_programs(mesh_of, ['train_step'], [],
                                                pick(tpu_programs.finetune_gin_files()), bindings)

  header = {'command': _command(argv), 'jax': jax.__version__, 'libtpu': tpu_slices.libtpu_version(),
            'machine': f'{platform.machine()}, {os.cpu_count()} CPUs, no TPU',
            'slice': {'name': tpu.name, 'topology': tpu.topology, 'chip_config': tpu.chip_config,
                      'chips': tpu.chips, 'hosts': tpu.hosts, 'hbm_gib': tpu.hbm_gib}}
  json_path = os.path.join(out_dir, f'{tpu.name}.json')
  if args.verify_curve:
    from specdec.cloud_tpu import tpu_verify_curve  # pylint: disable=g-import-not-at-top
    if tpu.topology.split(':')[0] not in tpu_verify_curve.PEAKS:
      raise SystemExit(f'tpu_compile: --verify_curve knows the peaks of {list(tpu_verify_curve.PEAKS)} only.')
    programs = lambda: tpu_verify_curve.curve_programs(mesh_of, bindings=bindings)
    json_path = os.path.join(out_dir, f'{tpu.name}_verify_curve.json')
  os.makedirs(out_dir, exist_ok=True)
  print(f'Compiling for {tpu.name} ({tpu.topology}, {tpu.chips} chips, {tpu.hosts} host(s)) into '
        f'{os.path.relpath(json_path, REPO)}', flush=True)
  results = tpu_compile.sweep(programs(), tpu, json_path, header, log=lambda line: print(line, flush=True),
                              retry_failed=args.retry_failed)
  if args.verify_curve:
    md_path = os.path.join(out_dir, f'{tpu.name}_verify_curve_predicted.md')
    tpu_verify_curve.write_markdown(json_path, md_path)
    print(f'Wrote {os.path.relpath(md_path, REPO)} ({tpu_verify_curve.LABEL})', flush=True)
    measured = _write_measured_curve(tpu.name, out_dir, 'auto')
    if measured:
      print(f'Wrote {os.path.relpath(measured, REPO)} (a TPU-measured curve exists: Table 2 from it)', flush=True)
  failed = [name for name, rec in results['programs'].items() if 'error' in rec]
  print(f'{len(results["programs"])} programs in {os.path.relpath(json_path, REPO)}'
        + (f'; failed: {", ".join(failed)}' if failed else ''), flush=True)


if __name__ == '__main__':
  main()
