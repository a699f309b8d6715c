# The demo run: load the CSV given as an input file, summarise it with pandas,
# and save a chart as an artifact. It runs inside the sandbox with no network.
import matplotlib.pyplot as plt
import pandas as pd

sales = pd.read_csv("sales.csv", parse_dates=["date"])
sales["revenue"] = sales["units"] * sales["unit_price"]

print(f"{len(sales)} rows, {sales['date'].min():%Y-%m-%d} to {sales['date'].max():%Y-%m-%d}")
by_region = sales.groupby("region")["revenue"].sum().sort_values(ascending=False)
print("\nRevenue by region:")
print(by_region.round(2).to_string())
print("\nUnits by product:")
print(sales.groupby("product")["units"].sum().to_string())

weekly = sales.set_index("date").groupby("region")["revenue"].resample("W").sum().unstack(0)
ax = weekly.plot(figsize=(8, 4), title="Weekly revenue by region")
ax.set_ylabel("revenue")
plt.tight_layout()
plt.savefig("revenue.png", dpi=100)
print("\nsaved revenue.png")
