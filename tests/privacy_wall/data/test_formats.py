"""read_tabular_csv: strict parsing; errors name lines and columns, never values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from privacy_wall.data.formats import FIRST_DATA_LINE, FormatError, read_tabular_csv


def write(tmp_path: Path, text: str, name: str = "data.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def read_error(path: Path, label: str | None = "y") -> str:
    with pytest.raises(FormatError) as info:
        read_tabular_csv(path, label)
    message = str(info.value)
    assert str(path) in message
    return message.replace(str(path), "<path>")  # tmp_path holds the test's parameters: not data


def test_reads_features_labels_and_names_with_label_in_the_middle(tmp_path: Path) -> None:
    path = write(tmp_path, "a,y,b\n0.25,1,-0.5\n1e-3,0,0\n 0.125 , 1 ,+2.5E-1\n")
    table = read_tabular_csv(path, "y")
    np.testing.assert_array_equal(table.features, [[0.25, -0.5], [1e-3, 0.0], [0.125, 0.25]])
    assert table.labels is not None
    np.testing.assert_array_equal(table.labels, [1.0, 0.0, 1.0])
    assert table.feature_names == ("a", "b")
    assert table.label_name == "y"
    assert (table.rows, table.dimension) == (3, 2)
    assert table.features.dtype == np.float64 and table.features.flags.c_contiguous


def test_without_label_every_column_is_a_feature(tmp_path: Path) -> None:
    table = read_tabular_csv(write(tmp_path, "a,y\n1,2\n3,4\n"), None)
    assert table.labels is None
    assert table.feature_names == ("a", "y")
    np.testing.assert_array_equal(table.features, [[1, 2], [3, 4]])


def test_single_column_and_single_row_stay_two_dimensional(tmp_path: Path) -> None:
    assert read_tabular_csv(write(tmp_path, "a\n5\n"), None).features.shape == (1, 1)
    assert read_tabular_csv(write(tmp_path, "a,b\n5,6\n"), None).features.shape == (1, 2)


def test_crlf_bom_quoted_header_and_trailing_blank_lines_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "crlf.csv"
    path.write_bytes(b'\xef\xbb\xbf"a",y\r\n0.5,1\r\n0.25,0\r\n\r\n\r\n')
    table = read_tabular_csv(path, "y")
    assert table.feature_names == ("a",)
    np.testing.assert_array_equal(table.features[:, 0], [0.5, 0.25])


def test_empty_file(tmp_path: Path) -> None:
    assert "empty file" in read_error(write(tmp_path, ""))


def test_header_without_data_rows(tmp_path: Path) -> None:
    assert "not followed by any data row" in read_error(write(tmp_path, "a,y\n\n"))


def test_missing_header_is_reported_without_echoing_the_first_row(tmp_path: Path) -> None:
    message = read_error(write(tmp_path, "0.61803,1\n0.5,0\n"), None)
    assert "header row" in message and "line 1" in message
    assert "0.61803" not in message


def test_duplicate_and_empty_column_names(tmp_path: Path) -> None:
    assert "more than once" in read_error(write(tmp_path, "a,a,y\n1,2,1\n"))
    assert "column 2 of the header has no name" in read_error(write(tmp_path, "a,,y\n1,2,1\n"))


def test_missing_label_column_names_the_label(tmp_path: Path) -> None:
    message = read_error(write(tmp_path, "a,b\n1,2\n"), "target")
    assert "no label column 'target'" in message


def test_label_as_only_column(tmp_path: Path) -> None:
    assert "only column" in read_error(write(tmp_path, "y\n1\n0\n"))


def test_row_with_too_many_cells_names_the_line_and_counts(tmp_path: Path) -> None:
    message = read_error(write(tmp_path, "a,b,y\n1,2,1\n3,4,0\n5,6,0,7\n"))
    assert "line 4" in message and "4 cells" in message and "3 columns" in message


def test_row_with_too_few_cells(tmp_path: Path) -> None:
    message = read_error(write(tmp_path, "a,b,y\n1,2,1\n3,0\n"))
    assert "line 3" in message and "2 cells" in message


def test_blank_line_between_rows(tmp_path: Path) -> None:
    message = read_error(write(tmp_path, "a,y\n1,1\n\n2,0\n"))
    assert "line 3" in message and "empty line" in message


def test_non_numeric_cell_names_line_and_column_but_not_the_value(tmp_path: Path) -> None:
    message = read_error(write(tmp_path, "age,income,y\n0.1,0.2,1\n0.3,secret42,0\n"))
    assert "line 3" in message and "'income'" in message and "not a number" in message
    assert "secret42" not in message


def test_quoted_numbers_are_not_numbers(tmp_path: Path) -> None:
    message = read_error(write(tmp_path, 'a,y\n1,1\n"0.75319",0\n'))
    assert "line 3" in message and "'a'" in message
    assert "0.75319" not in message


def test_empty_cell(tmp_path: Path) -> None:
    message = read_error(write(tmp_path, "a,b,y\n1,2,1\n3,,0\n"))
    assert "line 3" in message and "'b'" in message and "empty cell" in message


@pytest.mark.parametrize("cell", ["nan", "-inf", "Infinity", "1e999"])
def test_non_finite_values(tmp_path: Path, cell: str) -> None:
    message = read_error(write(tmp_path, f"a,b,y\n1,2,1\n3,4,0\n5,{cell},1\n"))
    assert "line 4" in message and "'b'" in message and "non-finite" in message
    assert cell not in message


def test_labels_must_be_zero_or_one(tmp_path: Path) -> None:
    message = read_error(write(tmp_path, "a,y\n0.1,1\n0.2,0\n0.3,0.73519\n0.4,2\n"))
    assert "line 4" in message and "'y'" in message and "0 or 1" in message and "2 rows" in message
    assert "0.73519" not in message
    # The same column without label= is just a feature.
    assert read_tabular_csv(write(tmp_path, "a,y\n0.3,0.73519\n", "ok.csv"), None).dimension == 2


def test_missing_file_and_directory(tmp_path: Path) -> None:
    assert "no such file" in read_error(tmp_path / "absent.csv")
    assert "directory" in read_error(tmp_path)


def test_error_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        read_tabular_csv(write(tmp_path, ""), None)


def test_error_line_numbers_match_data_rows(tmp_path: Path) -> None:
    rows = np.full((50, 3), 0.5)
    rows[37, 1] = np.inf
    lines = ["a,b,c"] + [",".join(repr(float(v)) for v in row) for row in rows]
    message = read_error(write(tmp_path, "\n".join(lines) + "\n"), None)
    assert f"line {37 + FIRST_DATA_LINE}" in message and "'b'" in message


def test_large_file_round_trips(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    features = rng.normal(size=(5000, 40))
    labels = rng.integers(0, 2, size=5000).astype(np.float64)
    path = tmp_path / "big.csv"
    header = ",".join([f"f{i}" for i in range(40)] + ["label"])
    np.savetxt(
        path, np.column_stack([features, labels]), delimiter=",", header=header, comments="", fmt="%.17g"
    )
    table = read_tabular_csv(path, "label")
    np.testing.assert_array_equal(table.features, features)
    assert table.labels is not None
    np.testing.assert_array_equal(table.labels, labels)
