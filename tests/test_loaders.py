"""Tests of the raw-file readers (tiny files written by the tests)."""

import os

import numpy as np
import pandas as pd
import pytest

from tff_fedrecgel.data import loaders
from tff_fedrecgel.errors import DataError


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _assert_one_line_naming(error, path):
    message = str(error.value)
    assert '\n' not in message
    assert path in message


# FilmTrust ------------------------------------------------------------------

_FILMTRUST = '1 1 2\n1 2 4\n2 1 3.5\n1 3 0.5\n3 7 1\n2 9 2\n'


def test_filmtrust_schema_and_order(tmp_path):
    path = _write(tmp_path, 'ft.txt', _FILMTRUST)
    frame = loaders.load_filmtrust(path)
    assert list(frame.columns) == ['user', 'item', 'timestamp']
    assert frame['user'].tolist() == [1, 1, 2, 1, 3, 2]
    assert frame['item'].tolist() == [1, 2, 1, 3, 7, 9]
    assert frame['user'].dtype == np.int64
    assert frame['timestamp'].dtype == np.int64


def test_filmtrust_pseudo_timestamps_follow_the_reference_recipe(tmp_path):
    path = _write(tmp_path, 'ft.txt', _FILMTRUST)
    frame = loaders.load_filmtrust(path)
    base = np.random.default_rng(42).integers(0, 1_000_000_000, size=6)
    occurrence = np.array([0, 1, 0, 2, 0, 1])  # Per-user index in row order.
    np.testing.assert_array_equal(frame['timestamp'],
                                  base * 1_000_000 + occurrence)


def test_filmtrust_pseudo_timestamps_are_deterministic(tmp_path):
    path = _write(tmp_path, 'ft.txt', _FILMTRUST)
    pd.testing.assert_frame_equal(loaders.load_filmtrust(path),
                                  loaders.load_filmtrust(path))


def test_filmtrust_occurrence_index_is_per_user():
    users = np.array([5, 6, 5, 5, 6])
    base = np.random.default_rng(42).integers(0, 1_000_000_000, size=5)
    ts = loaders.filmtrust_pseudo_timestamps(users)
    np.testing.assert_array_equal(ts - base * 1_000_000, [0, 0, 1, 2, 1])


def test_filmtrust_accepts_extra_whitespace(tmp_path):
    path = _write(tmp_path, 'ft.txt', '1  2 3\n1\t3 4\n')
    assert loaders.load_filmtrust(path)['item'].tolist() == [2, 3]


def test_missing_file(tmp_path):
    path = str(tmp_path / 'nope.txt')
    with pytest.raises(DataError, match='file not found') as error:
        loaders.load_filmtrust(path)
    _assert_one_line_naming(error, path)


def test_empty_file(tmp_path):
    path = _write(tmp_path, 'ft.txt', '')
    with pytest.raises(DataError, match='empty') as error:
        loaders.load_filmtrust(path)
    _assert_one_line_naming(error, path)


def test_blank_file_is_empty(tmp_path):
    path = _write(tmp_path, 'ft.txt', '\n\n')
    with pytest.raises(DataError) as error:
        loaders.load_filmtrust(path)
    _assert_one_line_naming(error, path)


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(DataError, match='directory') as error:
        loaders.load_filmtrust(tmp_path)
    _assert_one_line_naming(error, str(tmp_path))


@pytest.mark.parametrize('text', ['1 2 3 4\n5 6 7 8\n', '1 2\n3 4\n'])
def test_filmtrust_wrong_number_of_columns(tmp_path, text):
    path = _write(tmp_path, 'ft.txt', text)
    with pytest.raises(DataError, match='expected 3 columns') as error:
        loaders.load_filmtrust(path)
    _assert_one_line_naming(error, path)


def test_filmtrust_short_line(tmp_path):
    path = _write(tmp_path, 'ft.txt', '1 2 3\n1 2\n')
    with pytest.raises(DataError, match='line 2') as error:
        loaders.load_filmtrust(path)
    _assert_one_line_naming(error, path)


def test_filmtrust_non_numeric_id(tmp_path):
    path = _write(tmp_path, 'ft.txt', '1 2 3\nalice 2 3\n')
    with pytest.raises(DataError, match="non-numeric user id 'alice' on line 2"
                       ) as error:
        loaders.load_filmtrust(path)
    _assert_one_line_naming(error, path)


def test_filmtrust_non_numeric_rating(tmp_path):
    path = _write(tmp_path, 'ft.txt', '1 2 3\n1 3 good\n')
    with pytest.raises(DataError, match='non-numeric rating'):
        loaders.load_filmtrust(path)


# LastFM-2K and Amazon-Video ---------------------------------------------------


def test_lastfm(tmp_path):
    path = _write(tmp_path, 'lf.dat',
                  '2,52,13,1238536800000\n2,52,15,1238536800000\n'
                  '3,7,1,-428720400000\n')
    frame = loaders.load_lastfm_2k(path)
    assert frame['user'].tolist() == [2, 2, 3]
    assert frame['item'].tolist() == [52, 52, 7]
    assert frame['timestamp'].tolist() == [1238536800000, 1238536800000,
                                           -428720400000]
    assert frame['timestamp'].dtype == np.int64


def test_lastfm_non_numeric_item(tmp_path):
    path = _write(tmp_path, 'lf.dat', '2,52,13,1\n2,x52,13,2\n')
    with pytest.raises(DataError, match="non-numeric item id 'x52' on line 2"
                       ) as error:
        loaders.load_lastfm_2k(path)
    _assert_one_line_naming(error, path)


def test_lastfm_non_numeric_timestamp(tmp_path):
    path = _write(tmp_path, 'lf.dat', '2,52,13,1\n2,53,13,yesterday\n')
    with pytest.raises(DataError, match="non-numeric timestamp 'yesterday'"):
        loaders.load_lastfm_2k(path)


def test_lastfm_wrong_columns(tmp_path):
    path = _write(tmp_path, 'lf.dat', '2,52,1\n2,53,2\n')
    with pytest.raises(DataError, match='expected 4 columns'):
        loaders.load_lastfm_2k(path)


def test_lastfm_ragged_line(tmp_path):
    path = _write(tmp_path, 'lf.dat', '2,52,13,1\n2,53,13,2,9,9\n')
    with pytest.raises(DataError, match='cannot parse') as error:
        loaders.load_lastfm_2k(path)
    _assert_one_line_naming(error, path)


def test_amazon_string_ids_and_float_timestamps(tmp_path):
    path = _write(tmp_path, 'av.dat',
                  'AGZ8,B000G,5.0,1198195200\n'
                  'A9RN,0005019281,2.0,1281052800.5\n')
    frame = loaders.load_amazon_video(path)
    assert frame['user'].tolist() == ['AGZ8', 'A9RN']
    # Leading zeros of an ASIN survive: ids stay strings.
    assert frame['item'].tolist() == ['B000G', '0005019281']
    assert frame['timestamp'].dtype == np.float64


def test_amazon_non_numeric_timestamp(tmp_path):
    path = _write(tmp_path, 'av.dat', 'A,B,5.0,2014-01-01\n')
    with pytest.raises(DataError, match='non-numeric timestamp') as error:
        loaders.load_amazon_video(path)
    _assert_one_line_naming(error, path)


# QB-article ---------------------------------------------------------------


def test_qb_article_row_order_timestamps(tmp_path):
    path = _write(tmp_path, 'QB-article.csv',
                  'user_id,item_id,click,extra\n7,100,1,a\n8,100,1,b\n'
                  '7,101,1,c\n7,100,1,d\n8,5,1,e\n')
    frame = loaders.load_qb_article(path)
    assert frame['user'].tolist() == [7, 8, 7, 7, 8]
    assert frame['item'].tolist() == [100, 100, 101, 100, 5]
    assert frame['timestamp'].tolist() == [1, 1, 2, 3, 2]


def test_qb_article_missing_column(tmp_path):
    path = _write(tmp_path, 'QB-article.csv', 'user_id,article\n1,2\n')
    with pytest.raises(DataError, match='missing column.*item_id') as error:
        loaders.load_qb_article(path)
    _assert_one_line_naming(error, path)


def test_qb_article_header_only(tmp_path):
    path = _write(tmp_path, 'QB-article.csv', 'user_id,item_id\n')
    with pytest.raises(DataError, match='no data rows'):
        loaders.load_qb_article(path)


# Generic CSV ----------------------------------------------------------------


def test_csv_defaults(tmp_path):
    path = _write(tmp_path, 'r.csv', 'user,item\n10,a\n2,b\n10,c\n')
    frame = loaders.load_csv(path)
    assert frame['user'].dtype == np.int64  # All-integer ids become numbers.
    assert frame['item'].tolist() == ['a', 'b', 'c']
    assert frame['timestamp'].tolist() == [1, 1, 2]


def test_csv_named_columns_rating_threshold_and_timestamp(tmp_path):
    path = _write(tmp_path, 'r.tsv',
                  'ts\tuid\tiid\tstars\n5\tu1\ti1\t4\n3\tu1\ti2\t2\n'
                  '9\tu2\ti1\t5\n')
    frame = loaders.load_csv(path, sep='tab', user_col='uid', item_col='iid',
                             timestamp_col='ts', rating_col='stars',
                             min_rating=4)
    assert frame['user'].tolist() == ['u1', 'u2']
    assert frame['item'].tolist() == ['i1', 'i1']
    assert frame['timestamp'].tolist() == [5, 9]


def test_csv_without_header_uses_column_numbers(tmp_path):
    path = _write(tmp_path, 'r.txt', '1;x;100\n2;y;50\n')
    frame = loaders.load_csv(path, sep=';', header=False, user_col='1',
                             item_col=0, timestamp_col=2)
    assert frame['user'].tolist() == ['x', 'y']
    assert frame['item'].tolist() == [1, 2]
    assert frame['timestamp'].tolist() == [100, 50]


def test_csv_without_header_rejects_names(tmp_path):
    path = _write(tmp_path, 'r.txt', '1,2\n')
    with pytest.raises(DataError, match='0-based column number'):
        loaders.load_csv(path, header=False, user_col='user')


def test_csv_missing_column(tmp_path):
    path = _write(tmp_path, 'r.csv', 'uid,item\n1,2\n')
    with pytest.raises(DataError, match="no user column 'user'") as error:
        loaders.load_csv(path)
    _assert_one_line_naming(error, path)


def test_csv_non_numeric_timestamp(tmp_path):
    path = _write(tmp_path, 'r.csv', 'user,item,t\n1,2,3\n1,3,soon\n')
    with pytest.raises(DataError,
                       match="non-numeric timestamp 'soon' on line 3"):
        loaders.load_csv(path, timestamp_col='t')


def test_csv_threshold_leaves_nothing(tmp_path):
    path = _write(tmp_path, 'r.csv', 'user,item,r\n1,2,1\n')
    with pytest.raises(DataError, match='no row has rating'):
        loaders.load_csv(path, rating_col='r', min_rating=3)


def test_csv_min_rating_needs_rating_column(tmp_path):
    path = _write(tmp_path, 'r.csv', 'user,item\n1,2\n')
    with pytest.raises(DataError, match='rating column'):
        loaders.load_csv(path, min_rating=3)


def test_csv_separator_aliases():
    assert loaders.normalize_separator('tab') == '\t'
    assert loaders.normalize_separator('\\t') == '\t'
    assert loaders.normalize_separator('|') == '|'
    with pytest.raises(DataError):
        loaders.normalize_separator('')


def test_validate_raw_rejects_bad_frames():
    with pytest.raises(DataError, match='missing column'):
        loaders.validate_raw(pd.DataFrame({'user': [1]}), source='frame')
    with pytest.raises(DataError, match='numeric'):
        loaders.validate_raw(
            pd.DataFrame({'user': [1], 'item': [2], 'timestamp': ['x']}),
            source='frame')


def test_paths_may_be_pathlike(tmp_path):
    path = tmp_path / 'ft.txt'
    path.write_text(_FILMTRUST)
    assert len(loaders.load_filmtrust(path)) == 6
    assert len(loaders.load_filmtrust(os.fspath(path))) == 6


def test_csv_id_above_int64_is_said(tmp_path, caplog):
    """One id beyond int64 turns the column to text: a warning says so."""
    path = tmp_path / 'ratings.csv'
    path.write_text('user,item\n1,5\n2,99999999999999999999999\n3,10\n')
    with caplog.at_level('WARNING'):
        frame = loaders.load_csv(path)
    assert frame['user'].dtype == np.int64
    assert list(frame['item']) == ['5', '99999999999999999999999', '10']
    assert 'item id 99999999999999999999999 on line 3 does not fit in 64 bits' in caplog.text


def test_csv_separator_is_literal(tmp_path):
    path = tmp_path / 'r.csv'
    path.write_text('user(((item\n1(((2\n3(((4\n')
    frame = loaders.load_csv(path, sep='(((')
    assert frame['user'].tolist() == [1, 3] and frame['item'].tolist() == [2, 4]
    path.write_text('user.item\n1.2\n')  # '.' is a dot, not "any character".
    assert loaders.load_csv(path, sep='.')['item'].tolist() == [2]
