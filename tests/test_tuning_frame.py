"""The tuner's frame table (no training: run folders written by hand)."""

import json

from tff_fedrecgel import tuning_frame


def _metrics(hr_sampled, hr_full):
    return {'test/hr@10': hr_sampled, 'test/ndcg@10': hr_sampled / 2,
            'test_full/hr@10': hr_full, 'test_full/ndcg@10': hr_full / 2}


def _run(folder, hr_sampled, hr_full, popularity=(0.6, 0.1)):
    """A run folder's summary: its selections and the popularity floor
    every run carries."""
    folder.mkdir()
    metrics = _metrics(hr_sampled, hr_full)
    (folder / 'summary.json').write_text(json.dumps({
        'selections': {'valid': {k: v for k, v in metrics.items() if k.startswith('test/')},
                       'valid_full': {k: v for k, v in metrics.items()
                                      if k.startswith('test_full/')}},
        'popularity': _metrics(*popularity)}))
    return str(folder)


def test_the_gap_is_closed_against_the_tuned_ceiling(tmp_path):
    frame = {'ceiling': {'finished_trials': 2, 'best_trial': 1,
                         'best_run_dir': _run(tmp_path / 'ceiling', 0.9, 0.5)}}
    search = {'algorithm': 'fedrecgel', 'best_trial': 7,
              'best_run_dir': _run(tmp_path / 'best', 0.75, 0.4)}
    lines = tuning_frame.table_lines(search, frame)
    # The floor is the popularity every run's summary carries.
    assert lines[2].startswith('| popularity | 0.6000 | 0.3000 | — |')
    assert lines[-1].startswith('| fedrecgel (tuned, trial 7) | 0.7500 | 0.3750 | 0.50 |')
    assert lines[-1].endswith('| 0.4000 | 0.2000 | 0.75 |')
    assert not any(line.startswith('no ceiling') for line in lines)


def test_a_ceiling_search_with_no_trial_run_to_its_end_says_so(tmp_path):
    # What a large log gives when every central trial is stopped on the wall clock.
    frame = {'ceiling': {'finished_trials': 3, 'completed_trials': 0}}
    search = {'algorithm': 'fedrecgel', 'best_trial': 7,
              'best_run_dir': _run(tmp_path / 'best', 0.75, 0.4)}
    lines = tuning_frame.table_lines(search, frame)
    assert [line.split(' | ')[0] for line in lines[2:4]] == [
        '| popularity', '| fedrecgel (tuned, trial 7)']
    assert lines[3].endswith('| — |')  # No gap without a ceiling.
    assert lines[-1].startswith("no ceiling: none of the central model's 3 trials ran")
    assert '--trial_minutes' in lines[-1]


def test_the_floor_gives_only_the_protocols_the_runs_evaluated(tmp_path):
    best = tmp_path / 'best'
    best.mkdir()
    (best / 'summary.json').write_text(json.dumps({
        'selections': {'valid': {'test/hr@10': 0.7, 'test/ndcg@10': 0.35}},
        'popularity': {'test/hr@10': 0.6, 'test/ndcg@10': 0.3}}))
    search = {'algorithm': 'fedrecgel', 'best_trial': 0, 'best_run_dir': str(best)}
    lines = tuning_frame.table_lines(search, {'ceiling': {'finished_trials': 1}})
    assert lines[0] == '| run | test HR@10 sampled | test NDCG@10 sampled | gap closed sampled |'
    assert lines[2] == '| popularity | 0.6000 | 0.3000 | — |'


def test_the_ceiling_ranks_every_epoch_and_is_the_search_a_central_tuner_call_makes():
    """So a ceiling searched apart, beside the main search on the other core,
    is the one the frame resumes (and the epoch it picks is not rounded to
    the federated schedule, and a trial ends past its peak)."""
    from tff_fedrecgel import tuning

    main = tuning.TuneConfig.create('synthetic', fixed={'total_rounds': 400,
                                                        'rounds_per_full_eval': 10}, trials=5)
    ceiling = tuning_frame.ceiling_config(main)
    assert ceiling.base == {'total_rounds': tuning_frame.CEILING_EPOCHS, 'rounds_per_full_eval': 1,
                            'early_stopping_patience': tuning_frame.CEILING_PATIENCE}
    apart = tuning.TuneConfig.create('synthetic', algorithm='central', trials=3, fixed={
        'total_rounds': tuning_frame.CEILING_EPOCHS, 'rounds_per_full_eval': 1,
        'early_stopping_patience': tuning_frame.CEILING_PATIENCE})
    assert apart.definition == ceiling.definition
